#!/usr/bin/env bash
# Install Debian's Chromium for `make test-browser` (Playwright drives it; never `playwright install`).
set -euo pipefail
# A CJK font too: without one, Chromium draws the Chinese decks (notebooks/zh) as empty boxes.
FONT=/usr/share/fonts/truetype/wqy/wqy-microhei.ttc
if [ -x /usr/bin/chromium ] && [ -f "$FONT" ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium fonts-wqy-microhei
