#!/usr/bin/env bash
# Where a forwarded tools/call's CPU goes (issue 12): quiver-server's user and sys time per
# call for a local `template` echo and for the same call forwarded to the rmcp peer, and the
# same split for the floor of any hop (the tcp-relay peer in front of rmcp, which copies
# bytes and parses nothing); every server pinned to CPU 1, oha on CPU 0. With PERF=1 it also records a
# `perf record -F 4000 -e cpu-clock -g` profile of the forwarding server (perf.data in the
# working directory; read it with `perf report --no-children -g none --sort dso,symbol`).
#   bench/forwarding-split.sh [QUIVER_BINARY] [CONNECTIONS]
# Needs what `make bench-wire` installs: oha and the Rust peers under ~/.cache/quiver.
set -euo pipefail
source "$(dirname "$0")/../scripts/lib.sh"
bin="${1:-$(target_dir)/release/quiver-server}"
conns="${2:-16}"
oha_bin="$QUIVER_CACHE/tools/bin/oha"
rmcp="$QUIVER_CACHE/target-bench/release/rmcp-echo"
relay="$QUIVER_CACHE/target-bench/release/tcp-relay"
for f in "$bin" "$oha_bin" "$rmcp" "$relay"; do
  [ -x "$f" ] || { echo "missing $f (run make bench-wire once, and cargo build --release)" >&2; exit 1; }
done
tmp="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$tmp"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rport=$(port) fport=$(port) lport=$(port) xport=$(port)
printf "upstreams:\n  - name: rmcp\n    http: {url: 'http://127.0.0.1:%s/mcp'}\n" "$rport" > "$tmp/fwd.yaml"
printf "tools:\n  - name: echo\n    description: e\n    input: {text: string}\n    handler: {template: '{{text}}'}\n" > "$tmp/echo.yaml"
taskset -c 1 "$rmcp" --port "$rport" > "$tmp/rmcp.log" 2>&1 & pids+=($!)
serve() { # config port; the server's pid in $pid
  RUST_LOG=warn taskset -c 1 "$bin" --config "file:$1" --listen "127.0.0.1:$2" --admin-listen "127.0.0.1:$(port)" --pin-workers > "$tmp/q$2.log" 2>&1 &
  pid=$!
  pids+=("$pid")
}
serve "$tmp/fwd.yaml" "$fport"; fwd_pid=$pid
serve "$tmp/echo.yaml" "$lport"; local_pid=$pid
taskset -c 1 "$relay" --port "$xport" --to "127.0.0.1:$rport" > "$tmp/relay.log" 2>&1 &
relay_pid=$!
pids+=("$relay_pid")

body='{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}'
for p in "$fport" "$lport" "$xport"; do   # until each answers the call (the forwarder: once it imported echo)
  for i in $(seq 1 200); do
    out=$(curl -s -X POST -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' -d "$body" "http://127.0.0.1:$p/mcp" || true)
    case "$out" in *'"text":"hello"'*) break ;; esac
    [ "$i" = 200 ] && { echo "port $p never answered: $out" >&2; exit 1; }
    sleep 0.05
  done
done
oha() { taskset -c 0 "$oha_bin" --no-tui --output-format json -m POST -d "$body" -H Content-Type:application/json -H Accept:application/json,text/event-stream -c "$conns" "$@"; }
measure() { # label pid port
  oha -n 3000 "http://127.0.0.1:$3/mcp" > /dev/null
  local before after
  before=$(awk '{print $14, $15}' "/proc/$2/stat")
  oha -z 4s "http://127.0.0.1:$3/mcp" > "$tmp/oha.json"
  after=$(awk '{print $14, $15}' "/proc/$2/stat")
  python3 - "$1" "$before" "$after" "$tmp/oha.json" "$(getconf CLK_TCK)" <<'PY'
import json, sys
label, (u0, s0), (u1, s1), tick = sys.argv[1], map(int, sys.argv[2].split()), map(int, sys.argv[3].split()), int(sys.argv[5])
d = json.load(open(sys.argv[4]))
n = d["statusCodeDistribution"].get("200", 0)
bad = sum(v for k, v in d["statusCodeDistribution"].items() if k != "200")
assert n > 0 and bad == 0, d["statusCodeDistribution"]
print(f"{label:10} user {(u1 - u0) / tick / n * 1e6:5.1f} µs  sys {(s1 - s0) / tick / n * 1e6:5.1f} µs per call  ({n} calls)")
PY
}
echo "CPU per tools/call of the server in front, $conns connections ($bin; relay: the tcp-relay peer)"
for round in 1 2; do
  measure local "$local_pid" "$lport"
  measure forwarded "$fwd_pid" "$fport"
  measure relay "$relay_pid" "$xport"
done
if [ "${PERF:-0}" = 1 ]; then
  oha -n 3000 "http://127.0.0.1:$fport/mcp" > /dev/null
  perf record -F 4000 -e cpu-clock -g -p "$fwd_pid" -o perf.data -- sleep 6 > /dev/null 2>&1 &
  rec=$!
  oha -z 6s "http://127.0.0.1:$fport/mcp" > /dev/null
  wait "$rec"
  echo "profile of the forwarding server: perf.data"
fi
