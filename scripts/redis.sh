#!/usr/bin/env bash
# Debian's redis-server for the shared rate-limit and shared-task tests: its .debs (and the two libraries it
# needs beyond the base system) downloaded with apt-get into ~/.cache/quiver/redis and
# unpacked there (nothing is installed system-wide, no service is started). Prints the path
# of a wrapper that runs that redis-server with its libraries.
# Cold: about 4 s (1.3 MB of .debs); warm: instant.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

dir="$QUIVER_CACHE/redis"
bin="$dir/redis-server"
if [ ! -x "$bin" ]; then
  log "downloading Debian's redis-server into $dir"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/debs" "$dir.tmp/root"
  fetch() { (cd "$dir.tmp/debs" && apt-get download -qq redis-server redis-tools liblzf1 libjemalloc2); }
  # Stale package lists name versions the mirror no longer has: update them once and retry.
  fetch 2>/dev/null || { apt-get update -qq >/dev/null; fetch; }
  for deb in "$dir.tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$dir.tmp/root"; done
  cat > "$dir.tmp/redis-server" <<'SH'
#!/bin/sh
here="$(dirname "$(readlink -f "$0")")"
LD_LIBRARY_PATH="$here/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/root/usr/bin/redis-server" "$@"
SH
  chmod +x "$dir.tmp/redis-server"
  "$dir.tmp/redis-server" --version >/dev/null
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
fi
echo "$bin"
