#!/usr/bin/env python3
"""The per-call cost guard: counts the instructions (and allocations) quiver-server spends
on one request, and fails when a workload costs more than 3% over the committed baseline.

Run through `scripts/cost-guard.sh` (part of the test command; `--update` rewrites the
baseline). It measures work, not time: the release binary runs under valgrind's callgrind,
which counts every instruction the server executes, so the same binary, inputs and
environment give the same count on any load of the machine.

For each workload a fresh server serves a fixed ToolSet on 127.0.0.1 with one worker
thread, no admin listener, a fixed log level and nothing in its environment but what is
set here; this client (not instrumented) sends byte-identical requests, one at a time, on
one keep-alive HTTP/1.1 connection: the workload's set-up (`initialize` in the handshake
era), WARMUP requests, then callgrind's counters are zeroed, N1 requests, a dump, N2
requests, a dump. Instructions per request = (dump2 - dump1) / (N2 - N1): what start-up,
warm-up and the dumps themselves cost cancels. Allocations per request are counted the
same way, from the calls into jemalloc's allocating entry points that callgrind records.

jemalloc's time-driven housekeeping (the tcache GC every 10 ms of wall time, dirty and
muzzy page decay) would make the count depend on how fast the machine ran the program:
under valgrind's slowdown it would fire dozens of times more often per request than at
full speed. `_RJEM_MALLOC_CONF` switches it to the byte-driven GC and no decay, which makes
the count repeatable (spread across runs: a few tenths of a percent at most).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "bench/cost-baseline.json"
TOLERANCE = 0.03  # a workload fails when it costs more than this fraction over its baseline
ALLOC_TOLERANCE = 0.5  # ... or when it makes this many more allocations per request
WARMUP, N1, N2 = 50, 200, 1200
MALLOC_CONF = "experimental_tcache_gc:false,dirty_decay_ms:-1,muzzy_decay_ms:-1"
# jemalloc's entry points that hand out memory (the binary's symbols are prefixed _rjem_);
# a realloc counts as an allocation, as in the dispatch benchmark's counting allocator.
ALLOC_FNS = {"_rjem_malloc", "_rjem_mallocx", "_rjem_calloc", "_rjem_realloc", "_rjem_rallocx"}

TOOLSET = """\
tools:
  - name: echo
    description: Returns the text it is given.
    input: {text: string}
    handler: {template: '{{text}}'}
  - name: add
    description: Adds two numbers.
    handler: {builtin: add}
  - name: greet
    description: Greets someone by name.
    input: {name: string}
    handler: {template: 'Hello {{name}}!'}
"""
# The governed workload: a typical policy (an anonymous caller passes on its second clause)
# and a per-caller rate limit high enough never to refuse, as in the wire benchmark.
GOVERNANCE = """\
policies: [{name: typical, expression: "'sre' in caller.groups || args.text != 'prod'"}]
limits: [{rate: 1000000/s, burst: 1000000}]
"""
HANDSHAKE = "2025-11-25"
STATELESS = "2026-07-28"
CALL = {"name": "echo", "arguments": {"text": "hello"}}
STATELESS_META = {"io.modelcontextprotocol/protocolVersion": STATELESS, "io.modelcontextprotocol/clientCapabilities": {}}


@dataclass
class Workload:
    name: str
    about: str
    method: str
    params: dict
    era: str = HANDSHAKE
    toolset: str = TOOLSET
    flags: list[str] = field(default_factory=list)


WORKLOADS = [
    Workload("call", f"tools/call of a template tool, protocol {HANDSHAKE}, in a session", "tools/call", CALL),
    Workload("call-stateless", f"the same call, protocol {STATELESS} (no session)", "tools/call",
             {**CALL, "_meta": STATELESS_META}, era=STATELESS),
    Workload("list", f"tools/list of the 3-tool ToolSet, protocol {HANDSHAKE}, in a session", "tools/list", {}),
    Workload("call-governed", "the `call` workload with a policy and a per-caller rate limit on", "tools/call", CALL,
             toolset=TOOLSET + GOVERNANCE),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Conn:
    """One keep-alive HTTP/1.1 connection with a minimal reader (Content-Length or chunked)."""

    def __init__(self, port: int, deadline: float, proc: subprocess.Popen):
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
                break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"quiver-server exited with {proc.returncode} before listening")
                if time.monotonic() > deadline:
                    raise SystemExit("quiver-server did not listen within the start-up deadline")
                time.sleep(0.1)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port, self.buf = port, b""

    def request(self, body: bytes, headers: dict[str, str]) -> bytes:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"Accept: application/json, text/event-stream\r\n{head}Content-Length: {len(body)}\r\n\r\n").encode() + body

    def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise SystemExit("quiver-server closed the connection")
            self.buf += chunk

    def _until(self, sep: bytes) -> bytes:
        while sep not in self.buf:
            self._fill(len(self.buf) + 1)
        out, self.buf = self.buf.split(sep, 1)
        return out

    def exchange(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        self.sock.sendall(raw)
        head = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in head[1:])}
        if "content-length" in headers:
            n = int(headers["content-length"])
            self._fill(n)
            body, self.buf = self.buf[:n], self.buf[n:]
            return status, headers, body
        body = b""
        while size := int(self._until(b"\r\n"), 16):
            self._fill(size + 2)
            body, self.buf = body + self.buf[:size], self.buf[size + 2:]
        self._until(b"\r\n")
        return status, headers, body


def rpc(id_: int | None, method: str, params: dict | None = None) -> bytes:
    msg: dict = {"jsonrpc": "2.0", **({"id": id_} if id_ is not None else {}), "method": method}
    if params is not None:
        msg["params"] = params
    return json.dumps(msg, separators=(",", ":")).encode()


def set_up(c: Conn, w: Workload) -> dict[str, str]:
    """The workload's handshake; returns the headers of its repeated request."""
    if w.era == STATELESS:
        headers = {"MCP-Protocol-Version": STATELESS, "Mcp-Method": w.method}
        if "name" in w.params:
            headers["Mcp-Name"] = w.params["name"]
        return headers
    init = {"protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "cost-guard", "version": "1"}}
    status, headers, body = c.exchange(c.request(rpc(0, "initialize", init), {"MCP-Protocol-Version": HANDSHAKE}))
    sid = headers.get("mcp-session-id")
    if status != 200 or not sid or json.loads(body).get("result", {}).get("protocolVersion") != HANDSHAKE:
        raise SystemExit(f"initialize: HTTP {status} {body[:300]!r}")
    h = {"MCP-Protocol-Version": HANDSHAKE, "Mcp-Session-Id": sid}
    status, _, body = c.exchange(c.request(rpc(None, "notifications/initialized"), h))
    if status != 202:
        raise SystemExit(f"notifications/initialized: HTTP {status} {body[:300]!r}")
    return h


def check_first(w: Workload, status: int, body: bytes) -> None:
    """The first reply must be the right answer, so that a fast wrong one cannot pass."""
    try:
        result = json.loads(body)["result"]
    except (ValueError, KeyError):
        raise SystemExit(f"{w.name}: HTTP {status}, not a result: {body[:300]!r}") from None
    if status != 200:
        raise SystemExit(f"{w.name}: HTTP {status}: {body[:300]!r}")
    if w.method == "tools/call" and (result.get("isError") or result.get("content", [{}])[0].get("text") != "hello"):
        raise SystemExit(f"{w.name}: wrong answer {body[:300]!r}")
    if w.method == "tools/list" and len(result.get("tools", [])) != 3:
        raise SystemExit(f"{w.name}: wrong tool list {body[:300]!r}")
    if w.era == STATELESS and result.get("resultType") != "complete":
        raise SystemExit(f"{w.name}: not a {STATELESS} result {body[:300]!r}")


def callgrind(pid: int, what: str) -> None:
    """Zeroes (-z) or dumps (-d) the counters of a running callgrind through vgdb."""
    r = subprocess.run(["callgrind_control", what, str(pid)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or "Error" in r.stdout:
        raise SystemExit(f"callgrind_control {what} {pid} failed: {r.stdout}{r.stderr}")


def parse_dump(path: Path) -> tuple[int, int]:
    """(instructions, calls into jemalloc's allocating functions) of one callgrind dump."""
    total = allocs = 0
    callee = None
    with path.open() as f:
        for line in f:
            if line.startswith("cfn="):
                callee = re.sub(r"^\(\d+\) ?", "", line[4:].strip())
            elif line.startswith("calls=") and callee in ALLOC_FNS:
                allocs += int(line[6:].split()[0])
            elif line.startswith(("totals:", "summary:")):
                total = int(line.split()[1])
    if not total:
        raise SystemExit(f"{path}: no instruction total in the callgrind dump")
    return total, allocs


def measure(binary: str, w: Workload, tmp: Path) -> tuple[float, float]:
    """Instructions and allocations per request of one workload, one server process."""
    port = free_port()
    (tmp / "tools.yaml").write_text(w.toolset)
    out, log = tmp / "callgrind.out", tmp / "server.log"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", f"--log-file={tmp / 'valgrind.log'}",
           "--dump-instr=no", "--dump-line=no", "--compress-strings=no", "--compress-pos=no",
           binary, "--config", f"file:{tmp / 'tools.yaml'}", "--listen", f"127.0.0.1:{port}",
           "--admin-listen", "off", "--worker-threads", "1", "--log-format", "text", *w.flags]
    env = {"PATH": "/usr/bin:/bin", "RUST_LOG": "warn", "_RJEM_MALLOC_CONF": MALLOC_CONF}
    with log.open("wb") as logf:
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=logf, stderr=subprocess.STDOUT)
    try:
        c = Conn(port, time.monotonic() + 180, proc)
        raw = c.request(rpc(1, w.method, w.params), set_up(c, w))
        status, _, first = c.exchange(raw)
        check_first(w, status, first)

        def run(n: int) -> None:
            for _ in range(n):
                status, _, body = c.exchange(raw)
                if status != 200 or body != first:  # every counted request did the same work
                    raise SystemExit(f"{w.name}: a reply differs from the first: HTTP {status} {body[:300]!r}")

        run(WARMUP)
        callgrind(proc.pid, "-z")
        run(N1)
        callgrind(proc.pid, "-d")
        run(N2)
        callgrind(proc.pid, "-d")
        c.sock.close()
    except BaseException:
        proc.kill()
        proc.wait()
        sys.stderr.write(log.read_text(errors="replace")[-3000:])
        raise
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SystemExit(f"{w.name}: quiver-server did not stop within 120 s of SIGTERM") from None
    dumps = sorted(tmp.glob("callgrind.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    if len(dumps) < 2:
        raise SystemExit(f"{w.name}: expected two callgrind dumps, found {[d.name for d in dumps]}")
    (i1, a1), (i2, a2) = parse_dump(dumps[0]), parse_dump(dumps[1])
    return (i2 - i1) / (N2 - N1), (a2 - a1) / (N2 - N1)


def build_facts(binary: str) -> dict[str, str]:
    """What besides the code decides the count: the compiler, the PGO profile, the CPU
    (glibc picks memcpy and friends by CPU features) and valgrind (whose CPUID they see)."""
    comment = subprocess.run(["readelf", "-p", ".comment", binary], capture_output=True, text=True).stdout
    m = re.search(r"rustc version [^\n)]*\)?", comment)
    facts = {"rustc": m.group(0).strip() if m else "unknown"}
    built = Path(binary).with_name(Path(binary).name + ".build.json")  # written by scripts/images.sh
    facts["pgo"] = json.loads(built.read_text()).get("pgo", "unknown") if built.exists() else "unknown"
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.M)
    facts["cpu"] = model.group(1).strip() if model else "unknown"
    have = set(flags.group(1).split()) if flags else set()
    facts["cpu_features"] = " ".join(f for f in ("sse4_2", "avx", "avx2", "bmi2", "erms", "fsrm", "avx512f", "avx512bw") if f in have)
    facts["valgrind"] = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    return facts


def run_all(binary: str, workloads: list[Workload], repetitions: int, keep: Path | None) -> dict[str, dict]:
    results = {}
    for w in workloads:
        runs = []
        for i in range(repetitions):
            with tempfile.TemporaryDirectory(prefix="quiver-guard-") as tmp:
                runs.append(measure(binary, w, Path(tmp)))
                if keep:  # the dumps, for callgrind_annotate
                    shutil.copytree(tmp, keep / f"{w.name}-{i + 1}", dirs_exist_ok=True)
        instr = [r[0] for r in runs]
        med = statistics.median(instr)
        results[w.name] = {
            "instructions": round(med),
            "allocations": round(statistics.median(r[1] for r in runs), 1),
            "spread": (max(instr) - min(instr)) / med,
            "runs": [round(i) for i in instr],
        }
        print(f"  {w.name:<15} {med:>10,.0f} instructions/request (runs {', '.join(f'{i:,.0f}' for i in instr)}; "
              f"spread {results[w.name]['spread']:.2%}), {results[w.name]['allocations']} allocations/request", flush=True)
    return results


def compare(results: dict[str, dict], baseline: dict, facts: dict[str, str]) -> list[str]:
    """The failures, one message each; prints the table."""
    base = baseline.get("workloads", {})
    failures = []
    print(f"\n  {'workload':<15} {'instr/req':>10} {'baseline':>10} {'change':>8}   {'allocs/req':>10} {'baseline':>8}")
    for name, r in results.items():
        b = base.get(name)
        if b is None:
            failures.append(f"{name}: no baseline for this workload")
            continue
        change = r["instructions"] / b["instructions"] - 1
        print(f"  {name:<15} {r['instructions']:>10,} {b['instructions']:>10,} {change:>+8.2%}   {r['allocations']:>10} {b['allocations']:>8}")
        if change > TOLERANCE:
            failures.append(f"{name}: {b['instructions']:,} -> {r['instructions']:,} instructions per request "
                            f"({change:+.2%}; the limit is +{TOLERANCE:.0%})")
        elif change < -TOLERANCE:
            print(f"  note: {name} got {-change:.1%} cheaper; `scripts/cost-guard.sh --update` keeps the gain from being spent unnoticed")
        if r["allocations"] > b["allocations"] + ALLOC_TOLERANCE:
            failures.append(f"{name}: {b['allocations']} -> {r['allocations']} allocations per request")
    if failures:
        differ = [f"{k}: baseline '{baseline.get('facts', {}).get(k)}', now '{v}'"
                  for k, v in facts.items() if baseline.get("facts", {}).get(k) != v]
        if differ:
            failures.append("the build facts differ from the baseline's, which alone changes the count:\n      "
                            + "\n      ".join(differ))
    return failures


def self_test() -> None:
    """Proves the comparison fails when it should, before anything is measured: a check
    that cannot fail would pass every run."""
    base = {"facts": {}, "workloads": {"w": {"instructions": 10000, "allocations": 30.0}}}

    def fails(instructions: int, allocations: float) -> bool:
        with open(os.devnull, "w") as quiet:
            out, sys.stdout = sys.stdout, quiet
            try:
                return bool(compare({"w": {"instructions": instructions, "allocations": allocations}}, base, {}))
            finally:
                sys.stdout = out

    cases = [(10500, 30.0, True), (10301, 30.0, True), (10290, 30.0, False), (9000, 30.0, False), (10000, 31.0, True), (10000, 30.4, False)]
    for instructions, allocations, want in cases:
        if fails(instructions, allocations) != want:
            raise SystemExit(f"self-test: {instructions} instructions, {allocations} allocations against 10,000 and 30: "
                             f"the guard {'passed' if want else 'failed'} it")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quiver", required=True, help="the release quiver-server binary (scripts/images.sh --binaries)")
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ap.add_argument("--update", action="store_true", help="write the measured counts as the new baseline")
    ap.add_argument("--repetitions", type=int, default=3, help="server runs per workload (the median counts)")
    ap.add_argument("--only", nargs="*", help="measure only these workloads")
    ap.add_argument("--keep", type=Path, help="keep each run's callgrind dumps and logs under this directory")
    a = ap.parse_args()
    self_test()
    workloads = [w for w in WORKLOADS if not a.only or w.name in a.only]
    facts = build_facts(a.quiver)
    print(f"cost guard: {a.quiver}\n  " + "\n  ".join(f"{k}: {v}" for k, v in facts.items()), flush=True)
    results = run_all(a.quiver, workloads, a.repetitions, a.keep)
    if a.update:
        # With --only, the other workloads keep their entries.
        kept = json.loads(a.baseline.read_text()).get("workloads", {}) if a.only and a.baseline.exists() else {}
        measured = {w.name: {"about": w.about, "instructions": results[w.name]["instructions"],
                             "allocations": results[w.name]["allocations"]} for w in workloads}
        doc = {
            "about": "Instructions and allocations per request of quiver-server's release binary under callgrind "
                     "(bench/guard.py, scripts/cost-guard.sh). Regenerate with scripts/cost-guard.sh --update.",
            "tolerance": TOLERANCE,
            "facts": facts,
            "workloads": {w.name: measured.get(w.name) or kept[w.name] for w in WORKLOADS if w.name in measured or w.name in kept},
        }
        a.baseline.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nwrote {a.baseline}: commit it with the change that moved the count")
        return 0
    failures = compare(results, json.loads(a.baseline.read_text()), facts)
    if failures:
        print("\ncost guard FAILED: the server does more work per request than the baseline allows:\n  - "
              + "\n  - ".join(failures)
              + f"\nIf the growth is deliberate, update the baseline and commit it:\n  scripts/cost-guard.sh --update\n"
              "(docs/performance.md, 'The per-request cost guard', says what else moves the count.)", file=sys.stderr)
        return 1
    print(f"\ncost guard passed: every workload within +{TOLERANCE:.0%} of {a.baseline.relative_to(ROOT) if a.baseline.is_relative_to(ROOT) else a.baseline}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
