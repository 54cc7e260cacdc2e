"""Every sample of deploy/samples applied as a user would (`kubectl apply -f`, in a namespace of
its own) on the kind cluster: each McpServer it holds becomes Ready with a valid config, and
one with upstreams connects to them (`UpstreamsReady`).

A sample that needs something outside the cluster (an OpenID provider, a Redis, an API on the
internet) or a node this cluster does not have says so in a comment line of its own,
`# quiver.dev/e2e: skip — REASON`; it is reported as skipped with that reason, so the list of
what is not run here lives in the samples themselves. Every sample, skipped or not, passes
the API server's strict validation in a server-side dry run here, and `kubectl quiver check`
offline (operator/tests/plugin_check.rs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import Namespace

SAMPLES = Path(__file__).parents[2] / "deploy" / "samples"
SKIP = re.compile(r"^# quiver\.dev/e2e: skip — (\S.*)$", re.MULTILINE)


def skip_reason(text: str) -> str | None:
    m = SKIP.search(text)
    return m.group(1).strip() if m else None


def params() -> list:
    out = []
    for path in sorted(SAMPLES.glob("*.yaml")):
        reason = skip_reason(path.read_text())
        marks = [pytest.mark.skip(reason=f"{path.name}: {reason}")] if reason else []
        out.append(pytest.param(path.name, marks=marks, id=path.stem))
    return out


def test_every_skip_marker_has_its_form():
    """A marker written another way would be ignored and its sample run: each line that
    mentions the marker must read exactly as SKIP expects."""
    for path in SAMPLES.glob("*.yaml"):
        for line in path.read_text().splitlines():
            if "quiver.dev/e2e" in line:
                assert SKIP.match(line), f"{path.name}: {line!r} is not `# quiver.dev/e2e: skip — REASON`"


def test_every_sample_passes_the_api_servers_strict_validation(ns: Namespace):
    """Skipped samples included: `kubectl apply --dry-run=server` (strict field validation)
    refuses a field the CRD's schema would prune, which no offline check sees."""
    names = sorted(p.name for p in SAMPLES.glob("*.yaml"))
    assert len(names) >= 18, names
    for name in names:
        ns.k("apply", "--dry-run=server", "-f", "-", stdin=(SAMPLES / name).read_text())


@pytest.mark.parametrize("sample", params())
def test_sample_becomes_ready(ns: Namespace, sample: str):
    text = (SAMPLES / sample).read_text()
    servers = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "McpServer"]
    assert servers, f"{sample} holds no McpServer"
    ns.k("apply", "-f", "-", stdin=text)
    for mcp in servers:
        name = mcp["metadata"]["name"]
        ns.wait_condition(name, "Ready", "True", 300)
        assert ns.condition(name, "ConfigValid")["status"] == "True", ns.condition(name, "ConfigValid")
        if mcp["spec"].get("upstreams"):
            # The operator asks the pods' /status every 30 s.
            ns.wait_condition(name, "UpstreamsReady", "True", 180)
