"""Calls one tool on an MCP server with the official Python SDK and prints what it answered.

usage: mcp_call.py URL TOOL JSON_ARGS
"""

import asyncio
import json
import sys

from mcp import Client


async def main(url: str, tool: str, args: dict) -> None:
    async with Client(url) as client:
        info = client.server_info
        tools = await client.list_tools(cache_mode="bypass")
        print(f"connected to {info.name} {info.version} (MCP {client.protocol_version})")
        print("tools:", ", ".join(t.name for t in tools.tools))
        result = await client.call_tool(tool, args)
        text = " ".join(c.text for c in result.content if getattr(c, "text", None))
        print(f"{tool}({json.dumps(args)}) -> {text}")
        if result.is_error:
            sys.exit(f"{tool} answered with an error")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
