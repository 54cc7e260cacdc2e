"""Checks the catalog's answers against the official MCP registry's own documents.

operator/tests/cluster_catalog.rs saves what a real operator's catalog answered (lists,
pages, one server's versions, one server) into a directory; this script validates each file
against the registry's published OpenAPI document (docs/reference/api/openapi.yaml: the
`ServerList` and `ServerResponse` schemas) and each `server` object against the
`server.json` schema the registry validates publications with
(internal/validators/schemas/2025-12-11.json), both read from the registry's Go module,
github.com/modelcontextprotocol/registry at the version pinned below, fetched by `go mod
download` into the Go module cache (outside the clone).

Before trusting a pass, it checks that the validators refuse answers broken in the ways the
catalog must never break them (a description over 100 characters, a name without its
slash, a remote URL with a space, a list without `servers`).

Usage: validate.py DIR
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import yaml
from jsonschema import Draft7Validator, Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

MODULE = "github.com/modelcontextprotocol/registry"
VERSION = "v1.8.9"
SERVER_SCHEMA = "internal/validators/schemas/2025-12-11.json"
OPENAPI = "docs/reference/api/openapi.yaml"


def module_dir() -> Path:
    out = subprocess.run(["go", "mod", "download", "-json", f"{MODULE}@{VERSION}"],
                         check=True, capture_output=True, text=True, timeout=600).stdout
    return Path(json.loads(out)["Dir"])


def validators(root: Path):
    doc = yaml.safe_load((root / OPENAPI).read_text())
    registry = Registry().with_resource("urn:registry-openapi", Resource(contents=doc, specification=DRAFT202012))

    def component(name: str) -> Draft202012Validator:
        return Draft202012Validator({"$ref": f"urn:registry-openapi#/components/schemas/{name}"}, registry=registry)

    server = json.loads((root / SERVER_SCHEMA).read_text())
    return component("ServerList"), component("ServerResponse"), Draft7Validator(server)


def problems(answer: dict, server_list, server_response, server_json) -> list[str]:
    whole = server_list if "servers" in answer or "metadata" in answer else server_response
    found = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in whole.iter_errors(answer)]
    for item in answer.get("servers", [answer]) if isinstance(answer, dict) else []:
        if not isinstance(item, dict):
            continue
        found += [f"server.json {'/'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in server_json.iter_errors(item.get("server"))]
        official = item.get("_meta", {}).get("io.modelcontextprotocol.registry/official", {})
        for key in ("publishedAt", "updatedAt", "statusChangedAt"):
            try:
                datetime.fromisoformat(official[key])
            except (KeyError, TypeError, ValueError):
                found.append(f"_meta official {key}: not an RFC 3339 time: {official.get(key)!r}")
    return found


def main() -> int:
    samples = sorted(Path(sys.argv[1]).glob("*.json"))
    if not samples:
        print(f"no answers saved in {sys.argv[1]}", file=sys.stderr)
        return 1
    root = module_dir()
    checks = validators(root)
    # The validators must refuse what the catalog must never send.
    good = json.loads(samples[0].read_text())
    item = good["servers"][0] if "servers" in good else good
    for why, broken in [
        ("description over 100 characters", lambda s: s["server"].__setitem__("description", "x" * 101)),
        ("name without a slash", lambda s: s["server"].__setitem__("name", "no-slash")),
        ("remote URL with a space", lambda s: s["server"]["remotes"][0].__setitem__("url", "http://a b/mcp")),
        ("no version", lambda s: s["server"].pop("version")),
    ]:
        bad = copy.deepcopy(item)
        broken(bad)
        if not problems(bad, *checks):
            print(f"the validators accepted a server with a {why}: they check nothing", file=sys.stderr)
            return 1
    if not problems({"metadata": {"count": 0}}, *checks):
        print("the validators accepted a list without servers", file=sys.stderr)
        return 1
    failed = 0
    for f in samples:
        found = problems(json.loads(f.read_text()), *checks)
        for p in found:
            print(f"{f.name}: {p}", file=sys.stderr)
        failed += bool(found)
        if not found:
            print(f"{f.name}: valid ({MODULE}@{VERSION} {OPENAPI}, {SERVER_SCHEMA})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
