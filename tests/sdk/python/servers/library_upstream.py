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
from typing import Annotated

import mcp_types as types
from pydantic import BaseModel
from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve, Sample
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


def ask_name() -> Elicit[Name]:
    return Elicit("What is your name?", Name)


def ask_model(name: Annotated[Name, Resolve(ask_name)]) -> Sample:
    text = types.TextContent(type="text", text=f"Greet {name.name}")
    return Sample([types.SamplingMessage(role="user", content=text)], max_tokens=50)


@server.tool()
async def greet_in_rounds(
    name: Annotated[Name, Resolve(ask_name)],
    said: Annotated[types.CreateMessageResult, Resolve(ask_model)],
) -> str:
    """The same questions as greet_user, asked the way the request's revision asks: as
    requests mid-call (2025-11-25), or as input rounds (2026-07-28: an `input_required`
    result, and the call made again with the answers)."""
    return f"{name.name}: {said.content.text}"


@server.tool()
def find_guide() -> list:
    """Links the guide (a resource of this server) and embeds its first chapter of dune."""
    return [
        types.ResourceLink(type="resource_link", uri="file:///guide.md", name="guide"),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(uri="book://dune/chapter/1", text="chapter 1")),
    ]


NAME_QUESTION = types.ElicitRequest(
    params=types.ElicitRequestFormParams(
        message="What is your name?",
        requested_schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    )
)


def named(ctx: Context) -> str | None:
    """The name the user gave in this request's input round (2026-07-28), if any."""
    answer = (ctx.input_responses or {}).get("name")
    content = getattr(answer, "content", None) or (answer.get("content") if isinstance(answer, dict) else None)
    return content.get("name") if content else None


@server.prompt(name="greeting", description="A greeting for the user, who is asked their name.")
async def greeting(ctx: Context):
    """Asks as 2026-07-28 servers do: an input_required result, the answer on the retry."""
    who = named(ctx)
    if who is None:
        return types.InputRequiredResult(input_requests={"name": NAME_QUESTION})
    return f"Greet {who}"


@server.resource("welcome://{lang}", name="welcome", mime_type="text/plain")
async def welcome(lang: str, ctx: Context):
    who = named(ctx)
    if who is None:
        return types.InputRequiredResult(input_requests={"name": NAME_QUESTION})
    return f"Welcome ({lang}), {who}"


TITLES = ["dune", "dracula", "emma", "forbidden", "middlemarch"]


@server.completion()
async def complete(ref, argument, context):
    """Completes a chapter's title (and, once a title is chosen, its chapter number) and
    the summary style; a value carries the secret, which the gateway must redact."""
    if isinstance(ref, types.ResourceTemplateReference) and argument.name == "title":
        return types.Completion(values=[t for t in TITLES if t.startswith(argument.value)], total=len(TITLES), has_more=False)
    if isinstance(ref, types.ResourceTemplateReference) and argument.name == "n":
        chosen = (context.arguments or {}).get("title") if context else None
        return types.Completion(values=[f"{chosen}-1", f"{chosen}-2"] if chosen else ["1"])
    if isinstance(ref, types.PromptReference) and argument.name == "style":
        return types.Completion(values=["short", "long", f"as {os.environ.get('LIBRARY_TOKEN', 'none')}"])
    return None


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
