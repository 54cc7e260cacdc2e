#!/usr/bin/env bash
# The linux/arm64 binaries, cross-built on this amd64 machine and run under Debian's
# qemu-user (qemu-aarch64): quiver-server serves examples/tools.yaml on 127.0.0.1 and the
# official Python MCP client calls its tools and checks the answers; kubectl-quiver and
# quiver-operator answer --version and --help, and kubectl-quiver checks a manifest offline.
# `file` and readelf confirm each binary is aarch64 and static.
# The binaries come from the cargo profile release-smoke (the release profile without fat
# LTO, so a cold build takes minutes, not most of an hour; see docs/contributing.md#arm64),
# static like the release's, cached in ~/.cache/quiver/target-arm64-smoke.
#   scripts/arm64-smoke.sh             build (cached), check, run
#   scripts/arm64-smoke.sh --binaries  only build; prints the directory holding the three
#                                      binaries (scripts/release-it.sh releases them)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

triple=aarch64-unknown-linux-gnu
dir="$QUIVER_CACHE/target-arm64-smoke"
bins="$QUIVER_CACHE/arm64-smoke/bin"
cross_toolchain "$triple"
log "arm64 binaries (profile release-smoke, static; cached in $dir)"
CARGO_TARGET_DIR="$dir" RUSTFLAGS="$IMAGE_RUSTFLAGS" cargo build --profile release-smoke --locked \
  --target "$triple" -p quiver-server -p quiver-operator \
  --bin quiver-server --bin quiver-operator --bin kubectl-quiver
mkdir -p "$bins"
for b in quiver-server quiver-operator kubectl-quiver; do
  cp "$dir/$triple/release-smoke/$b" "$bins/"
  "$STRIP" --strip-debug "$bins/$b"
  check_static "$bins/$b" "$triple"
done
if [ "${1:-}" = --binaries ]; then echo "$bins"; exit 0; fi

command -v file >/dev/null || apt_install file
for b in quiver-server quiver-operator kubectl-quiver; do
  desc="$(file -b "$bins/$b")"
  [[ "$desc" == *"ARM aarch64"* && "$desc" == *"static"* ]] || { echo "$b: $desc" >&2; exit 1; }
  echo "$b: $desc"
done

command -v qemu-aarch64 >/dev/null || { log "installing Debian's qemu-user (once)"; apt_install --no-install-recommends qemu-user; }
python_env
work="$(mktemp -d "${TMPDIR:-/tmp}/quiver-arm64.XXXXXX")"
server=""
cleanup() {
  local status=$?
  if [ -n "$server" ]; then
    # The server drains and exits on SIGTERM; whatever state the emulation is in, it never
    # outlives the test (an orphan would take CPU from every later step).
    kill "$server" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  [ "$status" = 0 ] || { echo "--- quiver-server (arm64) log, last 40 lines"; tail -40 "$work/server.log"; } >&2
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
arm() { qemu-aarch64 "$@"; }

log "kubectl-quiver and quiver-operator (arm64) under qemu-aarch64"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
[ "$(arm "$bins/kubectl-quiver" --version)" = "kubectl-quiver $version" ] || fail "kubectl-quiver --version"
arm "$bins/kubectl-quiver" --help | grep -q '^  call ' || fail "kubectl-quiver --help lists no call command"
[ "$(arm "$bins/quiver-operator" --version)" = "quiver-operator $version" ] || fail "quiver-operator --version"
arm "$bins/kubectl-quiver" check -f deploy/samples/calculator.yaml > "$work/check.out" \
  || { cat "$work/check.out" >&2; fail "kubectl-quiver check of a valid sample"; }
sed 's/builtin: multiply/builtin: no-such-builtin/' deploy/samples/calculator.yaml > "$work/bad.yaml"
status=0
arm "$bins/kubectl-quiver" check -f "$work/bad.yaml" > "$work/check.out" 2>&1 || status=$?
[ "$status" = 1 ] && grep -q no-such-builtin "$work/check.out" \
  || { cat "$work/check.out" >&2; fail "kubectl-quiver check of an invalid manifest exited $status"; }
echo "ok: --version, --help, check (a valid and an invalid manifest)"

log "quiver-server (arm64) under qemu-aarch64, serving examples/tools.yaml on 127.0.0.1"
arm "$bins/quiver-server" check --config file:examples/tools.yaml >/dev/null || fail "quiver-server check"
read -r port admin < <("$PY" -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
# qemu-user (7.2) does not pass Landlock's system calls through, so the server would refuse
# to start exec tools: best-effort starts them unconfined (confinement is tested natively).
# qemu itself in the background (not through the arm function): $! must be the process the
# cleanup kills, or an orphaned emulated server keeps running (and spinning) after the test.
qemu-aarch64 "$bins/quiver-server" --config file:examples/tools.yaml --child-isolation=best-effort \
  --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" > "$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 600); do
  curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || fail "quiver-server (arm64) exited"
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null || fail "quiver-server (arm64) not ready after 60 s"

"$PY" - "http://127.0.0.1:$port/mcp" <<'PY'
"""Calls the arm64 server's tools with the official MCP client and checks each answer."""
import asyncio
import hashlib
import sys

from mcp import Client

CALLS = [
    ("add", {"a": 40, "b": 2}, "42"),
    ("sha256", {"text": "arm64"}, hashlib.sha256(b"arm64").hexdigest()),
    ("add-then-greet", {"a": 1, "b": 2}, "Hello 3!"),
    ("word-count", {"text": "one two three"}, "3"),
]


async def main(url: str) -> None:
    async with Client(url) as client:
        names = {t.name for t in (await client.list_tools(cache_mode="bypass")).tools}
        missing = {name for name, _, _ in CALLS} - names
        assert not missing, f"tools/list lacks {missing}: {names}"
        for name, args, want in CALLS:
            result = await client.call_tool(name, args)
            text = " ".join(c.text for c in result.content if getattr(c, "text", None)).strip()
            assert not result.is_error and text == want, f"{name}({args}) -> {text!r}, want {want!r}"
            print(f"ok: {name}({args}) -> {text}")


asyncio.run(main(sys.argv[1]))
PY
echo "arm64 smoke test: ok"
