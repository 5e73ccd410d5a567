#!/usr/bin/env bash
# Install Debian's Chromium for `make test-browser` (Playwright drives it; never `playwright install`).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium
