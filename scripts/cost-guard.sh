#!/usr/bin/env bash
# The per-request cost guard of the test command: counts the instructions and allocations
# the release quiver-server (scripts/images.sh, fat LTO + PGO) spends per request under
# valgrind's callgrind, for a few fixed workloads, and fails when one costs more than 3%
# over bench/cost-baseline.json. Counts, not timings: the same binary gives the same count
# on a busy machine. See docs/performance.md ("The per-request cost guard").
#   scripts/cost-guard.sh            check against the baseline
#   scripts/cost-guard.sh --update   rewrite the baseline (a deliberate change; commit it)
# QUIVER_GUARD_BIN=PATH measures that binary instead of building the tree's.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

command -v valgrind >/dev/null || apt_install valgrind
bin="${QUIVER_GUARD_BIN:-}"
if [ -z "$bin" ]; then
  # After the e2e step (make release) this is a cache hit: cargo finds the binaries fresh.
  bin="$("$ROOT/scripts/images.sh" --binaries | tail -n 1)/quiver-server"
fi
exec python3 "$ROOT/bench/guard.py" --quiver "$bin" "$@"
