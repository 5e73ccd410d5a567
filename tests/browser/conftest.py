"""Real-browser tests run only when asked: `make test-browser` (D2L_GPU_BROWSER=1)."""

import os

if os.environ.get("D2L_GPU_BROWSER") != "1":
    # Plain `pytest tests` does not even collect them: they need Chromium and minutes of CPU.
    collect_ignore = ["test_browser.py"]
