#!/usr/bin/env python3
"""Driver of scripts/operator-scale.sh: measures a running quiver-operator against a local
control plane holding N McpServers. Standard library only; talks to the API server on
127.0.0.1 with the control plane's admin certificate.

1. creates the shared ToolSet ConfigMaps and N McpServers (a mix: 2-5 inline tools each;
   every 5th also reads a labelled, watched ToolSet ConfigMap through `toolsFrom`; every
   50th an unlabelled one, re-read on resync) and times create -> every McpServer reconciled
   (status.observedGeneration current, ConfigValid=True), and -> every one Ready (its
   Deployment's pod Running on a kwok node);
2. waits until the operator is idle (its reconcile count unchanged for --quiet seconds);
3. edits --edits McpServers one at a time and times, through watches opened beforehand,
   the write -> the rendered ConfigMap carrying the edit, and the write -> the status
   observing the new generation; then edits one shared ToolSet and times the write -> every
   reading McpServer's ConfigMap updated;
4. API requests at rest: apiserver_request_total deltas by verb and resource over --rest
   seconds with the operator running, in windows of --window seconds (a resync period is
   300 s), then over --baseline seconds with it stopped (SIGSTOP: the rest of the control
   plane alone); the operator's share is the difference;
5. operator RSS and CPU time over the rest window.

    scripts/operator_scale.py --server URL --ca CA --cert CRT --key KEY --admin-port P --pid PID --n N
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import ssl
import statistics
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

NS = "scale"
TOOLSETS = 10


class Kube:
    """A few API calls over one TLS context; one connection per thread."""

    def __init__(self, server: str, ca: str, cert: str, key: str):
        u = urllib.parse.urlsplit(server)
        self.host, self.port = u.hostname, u.port or 443
        assert self.host == "127.0.0.1", "the API server must be local"
        self.ctx = ssl.create_default_context(cafile=ca)
        self.ctx.load_cert_chain(cert, key)
        self.local = threading.local()

    def conn(self, timeout: float = 30) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def call(self, method: str, path: str, body=None, ctype: str = "application/json"):
        c = getattr(self.local, "c", None)
        if c is None:
            c = self.local.c = self.conn()
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": ctype, "Accept": "application/json"} if data else {"Accept": "application/json"}
        try:
            c.request(method, path, body=data, headers=headers)
            r = c.getresponse()
        except (OSError, http.client.HTTPException):
            c.close()
            c = self.local.c = self.conn()
            c.request(method, path, body=data, headers=headers)
            r = c.getresponse()
        raw = r.read()
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {raw[:300]!r}")
        return json.loads(raw) if raw.startswith(b"{") else raw.decode()

    def watch(self, path: str, rv: str, on_event) -> None:
        """Follows a watch (bounded to an hour) in a daemon thread, calling on_event(obj)."""

        def run():
            c = self.conn(timeout=3700)
            sep = "&" if "?" in path else "?"
            c.request("GET", f"{path}{sep}watch=1&resourceVersion={rv}&timeoutSeconds=3600")
            r = c.getresponse()
            while True:
                line = r.readline()
                if not line:
                    return
                ev = json.loads(line)
                if ev.get("type") in ("ADDED", "MODIFIED"):
                    on_event(time.monotonic(), ev["object"])

        threading.Thread(target=run, daemon=True).start()


def toolset(k: int, marker: str = "") -> str:
    tools = [
        {"name": f"ts{k}-lookup", "description": f"Look up an entry of catalogue {k} by its key.",
         "input": {"key": "string"}, "handler": {"template": f"catalogue {k}: {{{{key}}}}{marker}"}},
        {"name": f"ts{k}-sum", "description": "Add two integers.", "handler": {"builtin": "add"}},
        {"name": f"ts{k}-echo", "description": "Echo the text back.", "handler": {"builtin": "echo"}},
    ]
    return json.dumps({"tools": tools})


def mcpserver(i: int, extra: str = "") -> dict:
    tools = [{"name": "add", "handler": {"builtin": "add"}},
             {"name": "greet", "description": "Greet someone by name.", "input": {"name": "string"},
              "handler": {"template": f"Hello {{{{name}}}} from {i}"}}]
    if i % 3 == 0:
        tools.append({"name": "echo", "handler": {"builtin": "echo"}})
    if i % 4 == 0:
        tools.append({"name": "report", "description": "Render a short report line.",
                      "input": {"team": "string", "count": "integer"},
                      "handler": {"template": "{{team}} closed {{count}} tickets"}})
    if extra:
        tools.append({"name": extra, "handler": {"builtin": "echo"}})
    spec: dict = {"tools": tools}
    if i % 50 == 0:
        spec["toolsFrom"] = [{"configMapKeyRef": {"name": "legacy-tools", "key": "tools.yaml"}}]
    elif i % 5 == 0:
        spec["toolsFrom"] = [{"configMapKeyRef": {"name": f"toolset-{i // 5 % TOOLSETS}", "key": "tools.yaml"}}]
    return {"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
            "metadata": {"name": f"s{i:05d}", "namespace": NS}, "spec": spec}


def readers(n: int, k: int) -> list[str]:
    return [f"s{i:05d}" for i in range(n) if i % 50 != 0 and i % 5 == 0 and i // 5 % TOOLSETS == k]


def reconciled(kube: Kube) -> tuple[int, int]:
    """McpServers whose status observes their generation with ConfigValid=True, and of
    those the ones also Ready=True."""
    valid = ready = 0
    for m in kube.call("GET", f"/apis/quiver.dev/v1alpha1/namespaces/{NS}/mcpservers")["items"]:
        st = m.get("status") or {}
        cond = {c["type"]: c["status"] for c in st.get("conditions", [])}
        if st.get("observedGeneration") == m["metadata"]["generation"] and cond.get("ConfigValid") == "True":
            valid += 1
            ready += cond.get("Ready") == "True"
    return valid, ready


def operator_metrics(port: int) -> dict[str, float]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith("quiver_operator_reconcile_duration_seconds_count"):
            out["reconciles"] = out.get("reconciles", 0) + float(line.rsplit(" ", 1)[1])
    return out


def api_requests(kube: Kube) -> dict[tuple[str, str], float]:
    """apiserver_request_total summed by (verb, resource[/subresource])."""
    out: dict[tuple[str, str], float] = {}
    for line in kube.call("GET", "/metrics").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.rindex("}")].replace('"', "").split(","))
        res = labels.get("resource", "") + ("/" + labels["subresource"] if labels.get("subresource") else "")
        key = (labels.get("verb", ""), res)
        out[key] = out.get(key, 0) + float(line.rsplit(" ", 1)[1])
    return out


def delta(a: dict, b: dict, seconds: float) -> dict:
    return {k: (b.get(k, 0) - a.get(k, 0)) / seconds for k in b if b.get(k, 0) - a.get(k, 0) > 0}


def cpu_seconds(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wait_for(cond: threading.Condition, pred, timeout: float):
    with cond:
        return cond.wait_for(pred, timeout)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def create(kube: Kube, n: int) -> tuple[float, float, float]:
    base = f"/api/v1/namespaces/{NS}/configmaps"
    for k in range(TOOLSETS):
        kube.call("POST", base, {"metadata": {"name": f"toolset-{k}", "labels": {"quiver.dev/tools": "true"}},
                                 "data": {"tools.yaml": toolset(k)}})
    kube.call("POST", base, {"metadata": {"name": "legacy-tools"}, "data": {"tools.yaml": toolset(99)}})
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: kube.call("POST", f"/apis/quiver.dev/v1alpha1/namespaces/{NS}/mcpservers",
                                          mcpserver(i)), range(n)))
    created = time.monotonic() - t0
    deadline, valid_at = t0 + 900, None
    while True:
        valid, ready = reconciled(kube)
        if valid >= n and valid_at is None:
            valid_at = time.monotonic() - t0
        if ready >= n:
            return created, valid_at, time.monotonic() - t0
        assert time.monotonic() < deadline, f"{valid} of {n} McpServers ConfigValid, {ready} Ready after 15 min"
        time.sleep(1)


def settle(port: int, quiet: float) -> float:
    """Waits (at most 10 min) until the reconcile count stays unchanged for `quiet` seconds."""
    t0 = time.monotonic()
    last, since = operator_metrics(port).get("reconciles"), time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() - t0 < 600, "the operator did not become idle within 10 min"
        time.sleep(1)
        now = operator_metrics(port).get("reconciles")
        if now != last:
            last, since = now, time.monotonic()
    return time.monotonic() - t0


def edits(kube: Kube, n: int, count: int) -> dict:
    cond = threading.Condition()
    cms: dict[str, str] = {}
    first_seen: dict[tuple[str, str], float] = {}
    gens: dict[str, int] = {}
    gen_seen: dict[tuple[str, int], float] = {}

    def on_cm(t, o):
        name, text = o["metadata"]["name"], (o.get("data") or {}).get("tools.yaml", "")
        with cond:
            cms[name] = text
            for key in [k for k in want_cm if k[0] == name and k[1] in text and k not in first_seen]:
                first_seen[key] = t
            cond.notify_all()

    def on_mcp(t, o):
        name, g = o["metadata"]["name"], (o.get("status") or {}).get("observedGeneration") or 0
        with cond:
            gens[name] = g
            for key in [k for k in want_gen if k[0] == name and g >= k[1] and k not in gen_seen]:
                gen_seen[key] = t
            cond.notify_all()

    want_cm: set[tuple[str, str]] = set()
    want_gen: set[tuple[str, int]] = set()
    cm_list = kube.call("GET", f"/api/v1/namespaces/{NS}/configmaps?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dquiver-operator")
    kube.watch(f"/api/v1/namespaces/{NS}/configmaps?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dquiver-operator",
               cm_list["metadata"]["resourceVersion"], on_cm)
    m_list = kube.call("GET", f"/apis/quiver.dev/v1alpha1/namespaces/{NS}/mcpservers")
    kube.watch(f"/apis/quiver.dev/v1alpha1/namespaces/{NS}/mcpservers", m_list["metadata"]["resourceVersion"], on_mcp)
    time.sleep(0.5)  # the watches are open before the first write (their GETs are sent)
    to_cm, to_status = [], []
    step = max(1, n // count)
    for j in range(count):
        i = (j * step + 1) % n
        name, marker = f"s{i:05d}", f"edit{j}x"
        with cond:
            want_cm.add((f"{name}-tools", marker))
        t0 = time.monotonic()
        r = kube.call("PATCH", f"/apis/quiver.dev/v1alpha1/namespaces/{NS}/mcpservers/{name}",
                      {"spec": mcpserver(i, marker)["spec"]}, "application/merge-patch+json")
        gen = r["metadata"]["generation"]
        with cond:
            want_gen.add((name, gen))
            for key in [k for k in want_gen if gens.get(k[0], 0) >= k[1] and k not in gen_seen]:
                gen_seen[key] = time.monotonic()
        ok = wait_for(cond, lambda: (f"{name}-tools", marker) in first_seen and (name, gen) in gen_seen, 60)
        assert ok, f"edit {j} of {name} not observed within 60 s"
        to_cm.append((first_seen[(f"{name}-tools", marker)] - t0) * 1e3)
        to_status.append((gen_seen[(name, gen)] - t0) * 1e3)
    # One shared ToolSet edited (the one s00005 reads): every McpServer reading it re-renders.
    names = readers(n, 1)
    marker = " (edited)"
    with cond:
        for nm in names:
            want_cm.add((f"{nm}-tools", marker))
    t0 = time.monotonic()
    kube.call("PATCH", f"/api/v1/namespaces/{NS}/configmaps/toolset-1", {"data": {"tools.yaml": toolset(1, marker)}},
              "application/merge-patch+json")
    ok = wait_for(cond, lambda: all((f"{nm}-tools", marker) in first_seen for nm in names), 120)
    assert ok, "the shared ToolSet edit did not reach every reader within 120 s"
    shared = (max(first_seen[(f"{nm}-tools", marker)] for nm in names) - t0) * 1e3
    return {"to_cm": to_cm, "to_status": to_status, "shared_readers": len(names), "shared_ms": shared}


def at_rest(kube: Kube, pid: int, admin: int, baseline: float, rest: float, window: float) -> dict:
    """The operator running for `rest` seconds, then stopped (SIGSTOP) for `baseline` seconds:
    what the rest of the control plane sends alone. The operator's share of each verb and
    resource is the difference of the two rates (never below zero)."""
    cpu0, rec0, t0 = cpu_seconds(pid), operator_metrics(admin).get("reconciles", 0), time.monotonic()
    first = prev = api_requests(kube)
    windows, rss = [], []
    while time.monotonic() - t0 < rest - 0.5:
        time.sleep(min(window, rest - (time.monotonic() - t0)))
        cur = api_requests(kube)
        windows.append(delta(prev, cur, window))
        prev = cur
        rss.append(rss_mib(pid))
    took = time.monotonic() - t0
    cpu_pct = (cpu_seconds(pid) - cpu0) / took * 100
    reconciles = operator_metrics(admin).get("reconciles", 0) - rec0
    running = delta(first, prev, took)
    a = api_requests(kube)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(baseline)
        b = api_requests(kube)
    finally:
        os.kill(pid, signal.SIGCONT)
    background = delta(a, b, baseline)
    share = lambda d: {k: v - background.get(k, 0) for k, v in d.items() if v - background.get(k, 0) > 0.005}  # noqa: E731
    operator = share(running)
    return {
        "background": sum(background.values()), "running": sum(running.values()),
        "operator": {f"{k[0]} {k[1]}": round(v, 2) for k, v in sorted(operator.items(), key=lambda kv: -kv[1])},
        "operator_total": sum(operator.values()), "windows": [sum(share(w).values()) for w in windows],
        "cpu_pct": cpu_pct, "reconciles": reconciles, "seconds": took,
        "rss_mib": statistics.median(rss) if rss else rss_mib(pid), "rss_max_mib": max(rss, default=0),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    for a in ("server", "ca", "cert", "key"):
        ap.add_argument(f"--{a}", required=True)
    ap.add_argument("--admin-port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--edits", type=int, default=20)
    ap.add_argument("--quiet", type=float, default=15)
    ap.add_argument("--baseline", type=float, default=60)
    ap.add_argument("--rest", type=float, default=60)
    ap.add_argument("--window", type=float, default=30)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    kube = Kube(a.server, a.ca, a.cert, a.key)
    kube.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    assert a.n > 5, "--n must be above 5 (s00005 reads the shared ToolSet that is edited)"
    say(f"creating {a.n} McpServers")
    created, valid, ready = create(kube, a.n)
    rss_ready = rss_mib(a.pid)
    say(f"all ConfigValid after {valid:.1f} s, Ready after {ready:.1f} s; waiting for the operator to be idle")
    settled = settle(a.admin_port, a.quiet)
    say(f"{a.edits} edits")
    e = edits(kube, a.n, a.edits)
    settle(a.admin_port, a.quiet)
    say(f"at rest: {a.rest:.0f} s running, then {a.baseline:.0f} s stopped")
    r = at_rest(kube, a.pid, a.admin_port, a.baseline, a.rest, a.window)
    res = {"n": a.n, "create_s": created, "valid_s": valid, "ready_s": ready, "settled_after_s": settled, "rss_ready_mib": rss_ready,
           **e, **r}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    ms = lambda xs: f"p50 {statistics.median(xs):.0f} ms, p99 {pct(xs, 0.99):.0f} ms, max {max(xs):.0f} ms"  # noqa: E731
    print(f"McpServers:                             {a.n} (every 5th reads a shared ToolSet, every 50th an unlabelled one)")
    print(f"create (4 concurrent POSTs):            {created:.1f} s")
    print(f"create start -> all ConfigValid:        {valid:.1f} s")
    print(f"create start -> all Ready:              {ready:.1f} s (operator idle {settled:.0f} s later)")
    print(f"edit -> rendered ConfigMap ({a.edits} edits):  {ms(e['to_cm'])}")
    print(f"edit -> status observedGeneration:      {ms(e['to_status'])}")
    print(f"shared ToolSet edit -> {e['shared_readers']} readers' ConfigMaps: {e['shared_ms']:.0f} ms")
    print(f"API requests/s at rest ({r['seconds']:.0f} s):       operator {r['operator_total']:.2f} "
          f"(control plane without it {r['background']:.2f}); per {a.window:.0f} s window: "
          + " ".join(f"{w:.2f}" for w in r["windows"]))
    print(f"  operator's by verb/resource:          {r['operator']}")
    print(f"reconciles at rest:                     {r['reconciles']:.0f} in {r['seconds']:.0f} s")
    print(f"operator CPU at rest:                   {r['cpu_pct']:.2f}% of a core")
    print(f"operator RSS:                           {rss_ready:.1f} MiB when all reconciled, "
          f"{r['rss_mib']:.1f} MiB at rest (max {r['rss_max_mib']:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
