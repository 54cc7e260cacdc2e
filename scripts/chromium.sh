#!/usr/bin/env bash
# The browser of the sign-in tests (tests/browser): Debian's chromium-headless-shell, the
# headless-only build of Chromium (no X server, no desktop), installed once with apt and
# without recommended packages (19 packages, 64 MB of .debs, 280 MB installed). Prints the
# path of the binary itself: /usr/bin/chromium-headless-shell is a shell script that runs it
# as a child, which a test would then have to end separately.
# Cold: about 12 s (apt-get update and install); warm: instant.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

bin=/usr/lib/chromium/chromium-headless-shell
if [ ! -x "$bin" ]; then
  start=$SECONDS
  log "installing Debian's chromium-headless-shell (once)"
  apt_install --no-install-recommends chromium-headless-shell
  [ -x "$bin" ] || { echo "chromium-headless-shell is installed, but $bin is not there" >&2; exit 1; }
  log "chromium-headless-shell installed in $((SECONDS - start)) s"
fi
echo "$bin"
