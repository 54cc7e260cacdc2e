"""Values at the edges of what the McpServer CRD documents start real pods on kind.

One McpServer sets every duration field of the CRD at its documented maximum (tasks `ttl`
24h, `drain` 60m, the task and shared-limit Redis timeouts 5s) and the other bounded
settings the server's flags come from at theirs (session affinity a day, the audit queue, the
tasks per caller, worker threads), with a real Redis (scripts/redis.sh) behind its tasks and
shared limits. It becomes Ready, its pod starts with those values in its arguments, and a
tool call goes through its shared limit, counted in that Redis. (operator/tests/server_args.rs proves the same for every field and bound without
a cluster, by the server's own flag parser; this is the pod really starting.)
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from conftest import Namespace
from mcp import Client
from redis_server import Redis, gateway_address


def mcp_server(redis: str) -> dict:
    return {
        "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "edges"},
        "spec": {
            "replicas": 1,
            "sessionAffinity": {"timeoutSeconds": 86400},
            "audit": {"onFull": "refuse", "queue": 65_536},
            "tasks": {"ttl": "24h", "drain": "60m", "perCaller": 10_000, "anonymousMax": 4096,
                      "redis": {"address": redis, "timeout": "5s"}},
            "limitsRedis": {"address": redis, "timeout": "5s", "failMode": "Closed"},
            "tuning": {"workerThreads": 256},
            "tools": [{
                "name": "add", "description": "Add two numbers", "handler": {"builtin": "add"},
                # One call an hour: the budget's key in Redis lives as long as the hour it
                # covers, so the test finds it there after the call (at a fast rate the key
                # expires within milliseconds).
                "limits": [{"rate": "1/h", "shared": True}],
            }],
        },
    }


def test_every_duration_at_its_documented_maximum_becomes_ready(ns: Namespace):
    tmp = Path(tempfile.mkdtemp(prefix="quiver-edges-"))
    redis = Redis(gateway_address(), tmp)
    try:
        ns.apply(mcp_server(f"{redis.host}:{redis.port}"))
        ns.wait_condition("edges", "Ready", "True", 240)
        [pod] = ns.ready_pods("edges", 1)
        args = ns.get("pod", pod)["spec"]["containers"][0]["args"]
        for flag in ["--tasks-ttl=24h", "--tasks-drain=60m", "--tasks-redis-timeout=5s",
                     "--limits-redis-timeout=5s"]:
            assert flag in args, f"{flag} not rendered: {args}"

        async def run(port: int):
            async with Client(f"http://127.0.0.1:{port}/mcp") as c:
                r = await c.call_tool("add", {"a": 40, "b": 2})
                assert (r.is_error, r.content[0].text) == (False, "42")

        with ns.port_forward(f"pod/{pod}", 8080) as port:
            asyncio.run(run(port))
        # The shared limit was counted in the real Redis behind its 5 s timeout.
        size = redis.command(b"DBSIZE")
        assert size.startswith(b":") and int(size[1:]) > 0, f"no key in Redis: {size!r}"
    finally:
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)
