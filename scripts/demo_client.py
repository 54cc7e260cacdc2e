"""Quick-start client: the official MCP Python SDK talking to quiver-server."""

import asyncio
import sys

import mcp_types as types
from mcp import Client


async def main(url: str, once: bool) -> None:
    changed = asyncio.Event()

    async def on_message(msg):
        if isinstance(msg, types.ToolListChangedNotification) or getattr(msg, "method", "") == "notifications/tools/list_changed":
            changed.set()

    async with Client(url, message_handler=on_message) as client:
        info = client.server_info
        print(f"connected to {info.name} {info.version} (MCP {client.protocol_version})")
        tools = await client.list_tools(cache_mode="bypass")
        print("tools:", ", ".join(t.name for t in tools.tools))
        result = await client.call_tool("add-then-greet", {"a": 40, "b": 2})
        print("add-then-greet(a=40, b=2) ->", result.content[0].text)
        if once:
            return
        print("\nEdit examples/tools.yaml (add a tool); the list below updates without a restart. Ctrl-C to stop.")
        while True:
            await changed.wait()
            changed.clear()
            tools = await client.list_tools(cache_mode="bypass")
            print("tools changed:", ", ".join(t.name for t in tools.tools))


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1], "--once" in sys.argv[2:]))
    except KeyboardInterrupt:
        pass
