#!/usr/bin/env bash
# Makes sure a Docker engine answers on the default socket. Uses a running one when there
# is one (a developer's machine); otherwise installs Debian's docker.io if needed and starts
# dockerd with its data under ~/.cache/quiver/docker. On hosts whose capability bounding set
# lacks CAP_SYS_RESOURCE, privileged containers (kind nodes) need runc-wrapper as the
# default runtime. Fails loudly when no engine can be started: the e2e suite never skips.
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"

DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER="$(command -v docker || true)"
if [ -n "$DOCKER" ] && "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1 && [ ! -x /usr/sbin/dockerd ]; then
  log "installing Debian's docker.io"
  apt_install docker.io
fi
DOCKER=/usr/bin/docker
state="$QUIVER_CACHE/docker"
mkdir -p "$state/data"
args=(--data-root "$state/data" --pidfile "$state/dockerd.pid" --host unix:///var/run/docker.sock
      --storage-driver overlay2 --log-level warn)
capbnd="$(awk '/^CapBnd:/ {print $2}' /proc/self/status)"
if (( (0x$capbnd >> 24 & 1) == 0 )); then
  install -m 0755 "$ROOT/deploy/kind/runc-wrapper" "$state/runc-wrapper"
  args+=(--add-runtime "quiver-runc=$state/runc-wrapper" --default-runtime quiver-runc)
fi
if [ -f "$state/dockerd.pid" ] && kill -0 "$(cat "$state/dockerd.pid")" 2>/dev/null; then
  log "dockerd (pid $(cat "$state/dockerd.pid")) is starting"
else
  log "starting dockerd (data in $state)"
  rm -f "$state/dockerd.pid"
  # The daemon outlives this script: it must not inherit the caller's descriptors, or a
  # lock the caller holds (`flock LOCK scripts/e2e.sh`) stays held for as long as dockerd runs.
  (
    for fd in $(ls /proc/$BASHPID/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null; done
    exec nohup /usr/sbin/dockerd "${args[@]}" > "$state/dockerd.log" 2>&1 < /dev/null
  ) &
fi
for _ in $(seq 1 300); do
  "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1 && exit 0
  [ -f "$state/dockerd.pid" ] && ! kill -0 "$(cat "$state/dockerd.pid")" 2>/dev/null && break
  sleep 0.2
done
echo "dockerd did not come up; its log ($state/dockerd.log) ends with:" >&2
tail -20 "$state/dockerd.log" >&2
exit 1
