"""make_slides: a failing, silent or hanging npm is said in one sentence with npm's own words."""

from __future__ import annotations

import stat

import make_slides
import pytest


def fake_npm(tmp_path, body: str):
    npm = tmp_path / "npm"
    npm.write_text("#!/bin/sh\n" + body + "\n")
    npm.chmod(npm.stat().st_mode | stat.S_IXUSR)
    return str(npm)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            "echo 'npm ERR! network request failed: ENOTFOUND' >&2; exit 1",
            "failed (exit 1): npm ERR! network",
        ),
        ("exit 0", "wrote no tarball; npm said: nothing"),
        ("echo made-up.tgz; exit 0", "wrote no tarball"),
        ("sleep 30", "did not finish within 1 s"),
    ],
)
def test_npm_failures_are_sentences(tmp_path, body, said):
    with pytest.raises(SystemExit) as info:
        make_slides.npm_pack("reveal.js@4", str(tmp_path), npm=fake_npm(tmp_path, body), timeout=1)
    assert said in str(info.value)


def test_npm_success_gives_the_tarball(tmp_path):
    npm = fake_npm(tmp_path, 'touch "$5/reveal.js-4.0.0.tgz"; echo reveal.js-4.0.0.tgz')
    assert make_slides.npm_pack("reveal.js@4", str(tmp_path), npm=npm) == "reveal.js-4.0.0.tgz"
