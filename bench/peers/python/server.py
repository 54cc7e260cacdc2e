"""Benchmark peer: the official MCP Python SDK (`mcp`, 2.x) serving one `echo` tool at /mcp.

Usage: python bench/peers/python/server.py --port N   (listens on 127.0.0.1:N only)
Needs: the `mcp` package (tests/requirements.txt pins it); uvicorn comes with it as a dependency.

What the SDK's docs recommend, and what this file does:
- In mcp 2.x `FastMCP` is renamed `MCPServer` (mcp.server.mcpserver), and the transport options
  are no longer constructor arguments: `stateless_http=` and `json_response=` are passed to
  `streamable_http_app()` (or `run("streamable-http", ...)`).
- For deployment the docs ("Add to an existing app", "Deploy & scale") say to build the ASGI app
  with `mcp.streamable_http_app(...)` and hand it to your ASGI server (uvicorn), and to add a health
  check with `@mcp.custom_route(...)`. We do that: `streamable_http_app(stateless_http=True,
  json_response=True)` served by uvicorn with one worker, log level warning, access log off.
  With host 127.0.0.1 the app arms its default DNS-rebinding protection (localhost Host/Origin).
- `stateless_http=True` only affects 2025-era ("legacy") requests such as the benchmark's
  2025-06-18 `tools/call`: each POST gets a throwaway per-request session, no Mcp-Session-Id, and
  no `initialize` is needed first. 2026-07-28 requests are sessionless regardless.
  `json_response=True` answers each POST with one `application/json` body instead of SSE.
- The tool is registered with `structured_output=False`, so its result is exactly one text block
  (with the default auto-detection a `-> str` tool would also return `structuredContent`).
- GET /healthz answers 200 "ok". uvicorn handles SIGTERM/SIGINT with a graceful shutdown; it then
  re-raises the signal under the handlers that were installed before it started. We install no-op
  handlers first so that re-raise is harmless and the process exits 0 like the other peers.
"""

import argparse
import signal

import uvicorn
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from mcp.server.mcpserver import MCPServer

HOST = "127.0.0.1"

mcp = MCPServer("bench-peer-python", log_level="WARNING")


@mcp.tool(description="Returns its input text unchanged", structured_output=False)
def echo(text: str) -> str:
    return text


@mcp.custom_route("/healthz", methods=["GET"])
async def healthz(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


app = mcp.streamable_http_app(stateless_http=True, json_response=True, host=HOST)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    uvicorn.run(app, host=HOST, port=args.port, workers=1, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
