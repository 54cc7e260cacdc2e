#!/usr/bin/env python3
"""Runs every PromQL expression of Quiver's dashboards and rules against a real Prometheus.

Fails when an expression is invalid or returns no series. Grafana variables are replaced
the way Grafana would with "All" selected ($namespace, $mcpserver, $tool -> .*) and
$__rate_interval by a window suited to the short test. Variable queries
(label_values(metric, label)) must find the label. Alerting rules must be valid and their
left-hand side (the expression without its threshold) must return series; recording rules
must return series. With --previews DIR, renders each dashboard's main panels from
query_range results to PNG files.
"""

import argparse
import json
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def api(base, path, **params):
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def substitute(expr, rate_window):
    expr = expr.replace("$__rate_interval", rate_window).replace("$__range", rate_window)
    return re.sub(r"\$\{?(namespace|mcpserver|tool)\}?", ".*", expr)


def lhs_of_alert(expr):
    """The expression without a trailing comparison against a number."""
    m = re.match(r"^(.*?)\s*(>|<|>=|<=|==|!=)\s*[0-9.eE+-]+\s*$", expr.strip(), re.S)
    return m.group(1) if m else expr


def has_data(result):
    """A query result with at least one series whose value is a number (a series of NaN is
    no data, e.g. histogram_quantile without a +Inf bucket)."""
    return any(s["value"][1] not in ("NaN", "+Inf", "-Inf") for s in result)


def check_expr(base, expr, what, failures, require_data=True):
    try:
        r = api(base, "query", query=expr)
    except urllib.error.HTTPError as e:
        failures.append(f"{what}: invalid: {e.read().decode()[:300]}")
        return None
    if r.get("status") != "success":
        failures.append(f"{what}: {r}")
        return None
    result = r["data"]["result"]
    if require_data and not result:
        failures.append(f"{what}: no series for {expr}")
    elif require_data and not has_data(result):
        failures.append(f"{what}: only NaN/Inf values for {expr}")
    return result


def check_dashboard(base, d, rate_window, failures, require_data=True):
    """Runs every variable query and panel target of dashboard `d` (its parsed JSON). Returns
    {"$variable": series having its label, "panel title [refId]": query result}; a query
    that is invalid (or, with require_data, empty) is added to `failures`."""
    results = {}
    for var in d["templating"]["list"]:
        if var["type"] != "query":
            continue
        definition = var["query"]["query"]
        m = re.match(r"label_values\((.*),\s*(\w+)\)$", definition)
        assert m, definition
        metric, label = substitute(m.group(1), rate_window), m.group(2)
        series = api(base, "series", **{"match[]": metric})["data"]
        results[f"${var['name']}"] = found = [s for s in series if label in s]
        if require_data and not found:
            failures.append(f"{d['title']} variable {var['name']}: no {label} on {metric}")
    for p in d["panels"]:
        for t in p["targets"]:
            what = f"{p['title']} [{t['refId']}]"
            expr = substitute(t["expr"], rate_window)
            res = check_expr(base, expr, f"{d['title']} / {what}", failures, require_data)
            results[what] = res
            if res:
                print(f"ok  {d['title']} / {what}: {len(res)} series")
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--rate-window", default="30s")
    ap.add_argument("--previews", help="directory for PNG previews")
    ap.add_argument("--since", type=float, help="start of the preview range (unix seconds)")
    args = ap.parse_args()
    failures, checked = [], 0
    dashboards = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
    for path in dashboards:
        results = check_dashboard(args.prometheus, json.loads(path.read_text()), args.rate_window, failures)
        checked += len(results)
    import yaml

    groups = yaml.safe_load((ROOT / "deploy" / "prometheus" / "quiver-rules.yaml").read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    for r in rules:
        checked += 1
        if "record" in r:
            res = check_expr(args.prometheus, r["expr"], f"recording rule {r['record']}", failures)
            if res:
                print(f"ok  record {r['record']}: {len(res)} series")
        else:
            check_expr(args.prometheus, r["expr"], f"alert {r['alert']} (full)", failures, require_data=False)
            res = check_expr(args.prometheus, lhs_of_alert(r["expr"]), f"alert {r['alert']} (lhs)", failures)
            if res:
                print(f"ok  alert {r['alert']}: lhs {len(res)} series")
    if args.previews:
        previews(args, dashboards)
    print(f"\n{checked} expressions checked, {len(failures)} failed")
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


def previews(args, dashboards):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.previews)
    out.mkdir(parents=True, exist_ok=True)
    end = time.time()
    start = args.since or end - 300
    for path in dashboards:
        d = json.loads(path.read_text())
        panels = [p for p in d["panels"] if p["type"] == "timeseries"][:6]
        fig, axes = plt.subplots(len(panels) // 2 + len(panels) % 2, 2, figsize=(14, 3.2 * ((len(panels) + 1) // 2)))
        for ax, p in zip(axes.flat, panels):
            unit = p["fieldConfig"]["defaults"]["unit"]
            scale, label = (1000.0, "ms") if unit == "s" else (100.0, "%") if unit == "percentunit" else (1.0, unit)
            for t in p["targets"]:
                expr = substitute(t["expr"], args.rate_window)
                r = api(args.prometheus, "query_range", query=expr, start=start, end=end, step=2)
                series = r["data"]["result"]
                peak = lambda s: max((float(v[1]) for v in s["values"] if v[1] not in ("NaN", "+Inf", "-Inf")), default=0.0)
                for s in sorted(series, key=peak, reverse=True)[:8]:
                    legend = t["legendFormat"]
                    for k, v in s["metric"].items():
                        legend = legend.replace("{{" + k + "}}", v)
                    xs = [float(v[0]) - start for v in s["values"]]
                    ys = [float(v[1]) * scale if v[1] not in ("NaN", "+Inf", "-Inf") else float("nan") for v in s["values"]]
                    ax.plot(xs, ys, label=legend or t["refId"], linewidth=1.2)
            ax.set_title(p["title"], fontsize=10)
            ax.set_xlabel("seconds into the test run", fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7, loc="upper left")
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.suptitle(f"{d['title']} — preview from real query results (Prometheus, test traffic)", fontsize=11)
        fig.tight_layout()
        target = out / f"{d['uid']}.png"
        fig.savefig(target, dpi=90)
        print(f"preview {target}")


if __name__ == "__main__":
    main()
