#!/usr/bin/env python3
"""Validates the dashboards against Grafana's own dashboard model (the official
grafana-foundation-sdk, generated from Grafana's schemas): each dashboard is decoded into
the SDK's typed Dashboard and encoded back; any key the model does not know is reported
(a misspelt `fieldConfig`, a `gridPos` without `w`, a variable field that does not exist).
Panel `options` and query targets are plugin-specific and left open, as in Grafana."""

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.models.dashboard import Dashboard

ROOT = Path(__file__).resolve().parents[2]
OPEN = {"options", "targets", "custom", "query", "current"}  # plugin- or datasource-specific


def missing(orig, back, path, out):
    if isinstance(orig, dict):
        if not isinstance(back, dict):
            out.append(f"{path}: not an object in Grafana's model")
            return
        for k, v in orig.items():
            if k in OPEN:
                continue
            if k not in back:
                out.append(f"{path}.{k}: unknown to Grafana's dashboard model")
            else:
                missing(v, back[k], f"{path}.{k}", out)
    elif isinstance(orig, list) and isinstance(back, list):
        for i, (a, b) in enumerate(zip(orig, back)):
            missing(a, b, f"{path}[{i}]", out)


def main():
    problems = []
    for path in sorted((ROOT / "deploy" / "grafana").glob("*.json")):
        d = json.loads(path.read_text())
        back = json.loads(json.dumps(Dashboard.from_json(d).to_json(), default=lambda o: getattr(o, "to_json", lambda: str(o))()))
        for field in ("uid", "title", "panels", "templating", "schemaVersion"):
            if field not in back:
                problems.append(f"{path.name}: required field {field} missing")
        found = []
        missing(d, back, path.name, found)
        problems += found
        for p in d["panels"]:
            gp = p.get("gridPos", {})
            if not all(k in gp for k in ("x", "y", "w", "h")) or gp["x"] + gp["w"] > 24:
                problems.append(f"{path.name}: panel {p['id']} gridPos {gp} is not inside the 24-column grid")
            if not p["fieldConfig"]["defaults"].get("unit"):
                problems.append(f"{path.name}: panel {p['id']} has no unit")
        ids = [p["id"] for p in d["panels"]]
        if len(ids) != len(set(ids)):
            problems.append(f"{path.name}: duplicate panel ids")
        print(f"{path.name}: {len(d['panels'])} panels, {len(d['templating']['list'])} variables checked")
    for p in problems:
        print("FAIL", p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
