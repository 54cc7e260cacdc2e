"""A misbehaving stdio MCP server (raw JSON-RPC, no SDK), to check that quiver-server survives
an upstream that breaks every rule: `hostile_upstream.py MODE`.

  garbage   banner and non-JSON lines on stdout around correct answers
  huge      answers tools/list with one line far over the size limit
  silent    never answers initialize
  evil      a tool list of bad names, duplicates, deep and broken schemas, and 12,000 tools
  flood     answers, then sends 5,000 list_changed and 5,000 stray progress notifications
  liar      answers with ids it was never sent, and results that are not CallToolResults
"""

from __future__ import annotations

import json
import sys

MODE = sys.argv[1]
out = sys.stdout


def send(msg) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def tools() -> list:
    if MODE != "evil":
        return [{"name": "ok", "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}}]
    deep = {"type": "object"}
    for _ in range(60):
        deep = {"type": "object", "properties": {"d": deep}}
    listed = [
        {"name": "ok", "inputSchema": {"type": "object"}},
        {"name": "ok", "inputSchema": {"type": "object"}},
        {"name": "bad name with spaces", "inputSchema": {"type": "object"}},
        {"name": "deep", "inputSchema": deep},
        {"name": "broken", "inputSchema": {"type": "object", "properties": {"x": {"type": 12}}}},
        {"inputSchema": {"type": "object"}},
        "not an object",
    ]
    listed += [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(12_000)]
    return listed


if MODE == "garbage":
    out.write("Starting hostile server v0.0.1...\n\n   \n{not json\n[1,2,3]\n")
    out.flush()

for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        continue
    if method == "initialize":
        if MODE == "silent":
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {"listChanged": True}}, "serverInfo": {"name": f"hostile-{MODE}", "version": "0"}}})
        if MODE == "garbage":
            out.write("log: initialized\n")
            out.flush()
    elif method == "tools/list":
        if MODE == "huge":
            out.write('{"jsonrpc":"2.0","id":%d,"result":{"tools":[],"pad":"%s"}}\n' % (rid, "x" * (6 << 20)))
            out.flush()
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools()}})
        if MODE == "flood":
            for i in range(5000):
                send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
                send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 10_000_000 + i, "progress": i}})
    elif method == "tools/call":
        if MODE == "liar":
            send({"jsonrpc": "2.0", "id": rid + 1000, "result": {"content": []}})
            send({"jsonrpc": "2.0", "id": "not-a-number", "result": {}})
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": "not a list"}})
            continue
        x = msg["params"].get("arguments", {}).get("x", "")
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": f"ok {x}"}]}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
