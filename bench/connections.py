#!/usr/bin/env python3
"""Whether the cost of a request grows with the connections open at once: quiver-server and the
axum-fixed ceiling (bench/peers/rust) counted side by side with K connections in flight.

The wire benchmark (bench/wire.py) measures CPU time per call, which on a shared machine also
moves with cache pressure, scheduling and whatever else runs. This script counts instead, in
waves: one request is sent on each of K keep-alive connections, then every answer is read, so
K requests are in flight together, as under a load generator with K connections.

- `--measure instructions`: each server runs under callgrind with its cache simulation; per
  request: instructions (Ir), first-level instruction and data cache misses (I1mr, D1mr,
  D1mw) and last-level misses (ILmr, DLmr, DLmw), counted between two dumps after a warm-up
  (so start-up cancels out).
- `--measure syscalls`: each server runs natively with strace attached to all its threads
  after the warm-up; per request: system calls by name.

quiver-server runs the cost guard's ToolSet (bench/guard.py) and answers its `call`
workload (a session tools/call of a template tool); axum-fixed answers every POST with fixed
bytes. Every answer is checked: quiver's must all equal the first, which must be the tool's
result.

  python3 bench/connections.py --quiver BIN --axum ~/.cache/quiver/target-bench/release/axum-fixed \
      --connections 1 16 128 --measure instructions
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import guard  # noqa: E402
from guard import Conn, free_port, rpc  # noqa: E402

WARM, FIRST, SECOND = 5, 10, 30  # waves: warm-up, then counted between two dumps
SYSCALL_WAVES = 200


class Waves:
    """K connections to one server, each with its request; `wave()` sends one on each and reads
    every answer."""

    def __init__(self, port: int, k: int, proc: subprocess.Popen, quiver: bool):
        self.conns = [Conn(port, time.monotonic() + 180, proc) for _ in range(k)]
        w = guard.WORKLOADS[0]
        self.raws = [c.request(rpc(1, w.method, w.params), guard.set_up(c, w) if quiver else {}) for c in self.conns]
        self.quiver, self.first = quiver, None

    def _answer(self, c: Conn) -> bytes:
        head = c._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        headers = {a.strip().lower(): b.strip() for a, b in (line.split(":", 1) for line in head[1:])}
        n = int(headers["content-length"])
        c._fill(n)
        body, c.buf = c.buf[:n], c.buf[n:]
        if head[0].split()[1] != "200":
            raise SystemExit(f"HTTP {head[0]}: {body[:300]!r}")
        return body

    def wave(self) -> None:
        for c, raw in zip(self.conns, self.raws):
            c.sock.sendall(raw)
        for c in self.conns:
            body = self._answer(c)
            if self.first is None:
                if self.quiver:
                    guard.check_first(guard.WORKLOADS[0], 200, body)
                self.first = body
            elif body != self.first:
                raise SystemExit(f"an answer differs from the first: {body[:300]!r}")

    def close(self) -> None:
        for c in self.conns:
            c.sock.close()


def last_totals(path: Path) -> tuple[list[str], list[int]]:
    events: list[str] = []
    totals: list[int] = []
    with path.open() as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith(("totals:", "summary:")):
                totals = [int(x) for x in line.split()[1:]]
    if not events or not totals:
        raise SystemExit(f"{path}: no events or totals")
    return events, totals


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def instructions(argv: list[str], port: int, k: int, quiver: bool) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="quiver-connections-"))
    out = tmp / "callgrind.out"
    cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", f"--callgrind-out-file={out}",
           f"--log-file={tmp / 'valgrind.log'}", "--dump-instr=no", "--dump-line=no", *argv]
    env = {"PATH": "/usr/bin:/bin", "RUST_LOG": "warn", "_RJEM_MALLOC_CONF": guard.MALLOC_CONF}
    with (tmp / "server.log").open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
    try:
        w = Waves(port, k, proc, quiver)
        for _ in range(WARM):
            w.wave()
        guard.callgrind(proc.pid, "-z")
        for _ in range(FIRST):
            w.wave()
        guard.callgrind(proc.pid, "-d")  # a dump also zeroes the counters
        for _ in range(SECOND):
            w.wave()
        guard.callgrind(proc.pid, "-d")
        w.close()
    finally:
        stop(proc)
    dumps = sorted(tmp.glob("callgrind.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    if len(dumps) < 2:
        raise SystemExit(f"expected two callgrind dumps in {tmp}")
    events, first = last_totals(dumps[0])
    _, second = last_totals(dumps[1])
    n = (SECOND - FIRST) * k
    return {e: (b - a) / n for e, a, b in zip(events, first, second) if e != "Dr" and e != "Dw"}


def syscalls(argv: list[str], port: int, k: int, quiver: bool) -> dict[str, float]:
    env = {"PATH": "/usr/bin:/bin", "RUST_LOG": "warn"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = Path(tempfile.mkdtemp(prefix="quiver-connections-")) / "strace.txt"
    try:
        w = Waves(port, k, proc, quiver)
        for _ in range(WARM):
            w.wave()
        threads = sum((["-p", t] for t in os.listdir(f"/proc/{proc.pid}/task")), [])
        st = subprocess.Popen(["strace", "-c", "-o", str(out), *threads], stderr=subprocess.PIPE, text=True)
        # strace says "Process N attached" once per thread when it is in place.
        attached = 0
        while attached < len(threads) // 2:
            line = st.stderr.readline()
            if not line:
                raise SystemExit("strace ended before attaching")
            attached += "attached" in line
        for _ in range(SYSCALL_WAVES):
            w.wave()
        st.send_signal(signal.SIGINT)
        st.wait(timeout=60)
        w.close()
    finally:
        stop(proc)
    counts: dict[str, float] = {}
    for line in out.read_text().splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if m and m.group(2) != "total":
            counts[m.group(2)] = int(m.group(1)) / (SYSCALL_WAVES * k)
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quiver", required=True, help="a release quiver-server binary")
    ap.add_argument("--axum", required=True, help="the axum-fixed peer (bench/peers/rust)")
    ap.add_argument("--connections", type=int, nargs="+", default=[1, 16, 128])
    ap.add_argument("--measure", choices=["instructions", "syscalls"], default="instructions")
    args = ap.parse_args()
    tools = Path(tempfile.mkdtemp(prefix="quiver-connections-")) / "tools.yaml"
    tools.write_text(guard.TOOLSET)
    measure = instructions if args.measure == "instructions" else syscalls
    for k in args.connections:
        for name in ("quiver", "axum-fixed"):
            port = free_port()
            if name == "quiver":
                argv = [args.quiver, "--config", f"file:{tools}", "--listen", f"127.0.0.1:{port}",
                        "--admin-listen", "off", "--worker-threads", "1"]
            else:
                argv = [args.axum, "--port", str(port)]
            per = measure(argv, port, k, name == "quiver")
            shown = " ".join(f"{e}={v:,.1f}" if args.measure == "instructions" else f"{e}={v:.2f}"
                             for e, v in list(per.items())[:8])
            print(f"connections={k:<4} {name:<11} {shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
