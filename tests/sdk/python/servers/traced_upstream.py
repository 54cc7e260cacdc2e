"""An MCP server written with the official Python SDK that tells what trace context a call
reached it with: `traced_upstream.py http PORT` (Streamable HTTP)."""

from __future__ import annotations

import json
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("traced-upstream", version="1.0.0", log_level="WARNING")


@server.tool()
def trace_context(ctx: Context) -> str:
    """The W3C trace context of the call: `_meta.traceparent`/`tracestate`, and the same
    HTTP headers of the request that carried it as `header.traceparent`... (as JSON)."""
    rc = ctx.request_context
    meta = rc.meta or {}
    if not isinstance(meta, dict):
        meta = meta.model_dump() if hasattr(meta, "model_dump") else dict(meta)
    seen = {k: meta.get(k) for k in ("traceparent", "tracestate")}
    headers = getattr(rc.request, "headers", None) or {}
    seen.update({f"header.{k}": headers.get(k) for k in ("traceparent", "tracestate")})
    return json.dumps(seen)


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
