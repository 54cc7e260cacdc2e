"""An MCP server written with the official Python SDK that offers resources (fixed and
templated), prompts and resource subscriptions besides tools, for quiver-server to front:
`library_upstream.py NAME stdio` or `library_upstream.py NAME http PORT [--2026-only]`.
With `--2026-only` it refuses `initialize`: it speaks protocol 2026-07-28 only.

Two of them (different NAMEs) list the same URIs and prompt names, so a test sees that the
gateway keeps them apart. The environment's LIBRARY_TOKEN is a secret the server leaks in a
resource and a prompt, which the gateway must redact."""

from __future__ import annotations

import os
import sys

import mcp_types as types
from pydantic import BaseModel
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import AssistantMessage, UserMessage
from mcp.shared.exceptions import MCPError

NAME = sys.argv[1]
server = MCPServer(f"library-{NAME}", version="1.0.0", log_level="WARNING")
EDITION = {"n": 1}


@server.resource("file:///guide.md", name="guide", mime_type="text/markdown", description="The guide.")
def guide() -> str:
    return f"# {NAME} guide, edition {EDITION['n']}"


@server.resource("book://{title}/chapter/{n}", name="chapter", mime_type="text/plain")
def chapter(title: str, n: str) -> str:
    return f"{NAME}: {title}, chapter {n}"


@server.resource("file:///leak.txt", name="leak", mime_type="text/plain")
def leak() -> str:
    return f"token={os.environ.get('LIBRARY_TOKEN', '')}"


@server.prompt(name="summarize", description="Summarize a text.")
def summarize(text: str, style: str = "short") -> list:
    return [
        UserMessage(f"[{NAME}] Summarize ({style}): {text}"),
        AssistantMessage(f"token={os.environ.get('LIBRARY_TOKEN', '')}"),
    ]


@server.tool()
async def new_edition(ctx: Context) -> str:
    """Publishes the next edition of the guide and tells subscribers."""
    EDITION["n"] += 1
    await tell(ctx, lambda s: s.send_resource_updated("file:///guide.md"), ctx.notify_resource_updated("file:///guide.md"))
    return f"edition {EDITION['n']}"


async def tell(ctx: Context, in_session, to_listens) -> None:
    """Sends a notification to a session's client (the handshake revisions) and to the
    2026-07-28 listens (the revision the request came in decides which exist)."""
    try:
        await in_session(ctx.session)
    except Exception:  # noqa: BLE001 - a stateless request has no session to tell
        pass
    await to_listens


@server.tool()
async def add_appendix(ctx: Context) -> str:
    """Adds a resource and a prompt, and says the lists changed."""

    @server.resource("file:///appendix.md", name="appendix", mime_type="text/markdown")
    def appendix() -> str:
        return "appendix"

    @server.prompt(name="translate")
    def translate(text: str) -> str:
        return f"Translate: {text}"

    await tell(ctx, lambda s: s.send_resource_list_changed(), ctx.notify_resources_changed())
    await tell(ctx, lambda s: s.send_prompt_list_changed(), ctx.notify_prompts_changed())
    return "added"


class Name(BaseModel):
    name: str


@server.tool()
async def greet_user(ctx: Context) -> str:
    """Asks the user for a name (elicitation), then the client's model for a greeting
    (sampling): both questions go to the client of this call."""
    asked = await ctx.elicit("What is your name?", schema=Name)
    if asked.action != "accept":
        return f"no name ({asked.action})"
    said = await ctx.session.create_message(
        messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=f"Greet {asked.data.name}"))],
        max_tokens=50,
        related_request_id=ctx.request_id,  # on this call's stream, not the session's
    )
    return f"{asked.data.name}: {said.content.text}"


async def on_subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


server._lowlevel_server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, on_subscribe)
server._lowlevel_server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, on_subscribe)


class NoSessions:
    """Refuses `initialize`, as a server that speaks only 2026-07-28 does."""

    async def __call__(self, ctx, call_next):
        if ctx.method == "initialize":
            raise MCPError(-32601, "Method not found: initialize (this server speaks 2026-07-28 only)")
        return await call_next(ctx)


if "--2026-only" in sys.argv:
    server._lowlevel_server.middleware.append(NoSessions())

if __name__ == "__main__":
    if sys.argv[2] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
