"""A steady MCP load for the fault scenarios: N keep-alive HTTP/1.1 connections, each sending
`tools/call add` requests in a loop, with every outcome counted.

    python loadgen.py --port P --connections N --interval S [--duration D] [--hold]

Runs until SIGTERM (or --duration), then stops sending, lets the requests in flight finish
and prints one JSON object: requests, ok, failures by kind, retries, latency percentiles and
the most connections held open at once.

What counts as a failure: a connection that cannot be opened, a request that gets no answer
(reset, closed, 10 s without a response), a status other than 200, a JSON-RPC error, and a
wrong sum. One thing is retried, as HTTP clients do: a request on a connection that had
served earlier requests and is closed before any byte of the answer arrives (the server
closed the idle connection as the request went out, RFC 9112 section 9.3.1). Such retries
are counted and reported, never hidden; a retry that fails is a failure.

With --hold every connection is opened before any request is sent and kept open to the end:
the "N concurrent keep-alive connections" scenario. QUIVER_LOADGEN_AUTHORIZATION, when set, is
sent as every request's Authorization header (a bearer token, kept off the command line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections import Counter

REQUEST_TIMEOUT = 10.0
AUTHORIZATION = os.environ.get("QUIVER_LOADGEN_AUTHORIZATION")


class Stats:
    def __init__(self) -> None:
        self.sent = 0
        self.ok = 0
        self.failures: Counter[str] = Counter()
        self.retried_stale = 0
        self.reconnects = 0
        self.latencies: list[float] = []
        self.samples: list[str] = []
        self.t0 = time.monotonic()
        self.open = 0
        self.max_open = 0

    def fail(self, kind: str, detail: str = "") -> None:
        """Counts a failure; the first few are kept with when they happened, for the report."""
        self.failures[kind] += 1
        if len(self.samples) < 10:
            self.samples.append(f"{time.monotonic() - self.t0:.2f}s {kind} {detail}"[:300])

    def opened(self) -> None:
        self.open += 1
        self.max_open = max(self.max_open, self.open)

    def closed(self) -> None:
        self.open -= 1

    def summary(self) -> dict:
        lat = sorted(self.latencies)

        def pct(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else None

        return {
            "requests": self.sent,
            "ok": self.ok,
            "failed": sum(self.failures.values()),
            "failures": dict(self.failures),
            "retried_stale": self.retried_stale,
            "reconnects": self.reconnects,
            "p50_ms": pct(0.50),
            "p99_ms": pct(0.99),
            "max_ms": round(lat[-1] * 1000, 2) if lat else None,
            "max_open_connections": self.max_open,
            "failure_samples": self.samples,
        }


class Stale(Exception):
    """The connection was closed before any byte of the answer: safe to retry once."""


class Conn:
    def __init__(self, port: int, stats: Stats) -> None:
        self.port = port
        self.stats = stats
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.served = 0
        self.opens = 0

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", self.port), REQUEST_TIMEOUT
        )
        self.served = 0
        self.opens += 1
        self.stats.opened()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.reader = None
            self.stats.closed()

    async def exchange(self, body: bytes) -> tuple[int, bytes, bool]:
        """One request; (status, body, server asked to close)."""
        assert self.reader is not None and self.writer is not None
        head = (
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-11-25\r\n"
            + (f"Authorization: {AUTHORIZATION}\r\n" if AUTHORIZATION else "")
            + f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        reused = self.served > 0
        try:
            self.writer.write(head + body)
            await self.writer.drain()
            status_line = await self.reader.readline()
        except (ConnectionError, OSError) as e:
            if reused:
                raise Stale() from e
            raise
        if not status_line:
            if reused:
                raise Stale()
            raise ConnectionError("closed before answering")
        status = int(status_line.split()[1])
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        data = await self.reader.readexactly(length)
        self.served += 1
        return status, data, close


async def one_request(conn: Conn, stats: Stats, i: int) -> None:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "add", "arguments": {"a": i, "b": 1}}}
    ).encode()
    stats.sent += 1
    start = time.monotonic()
    for attempt in (1, 2):
        try:
            if conn.writer is None:
                stats.reconnects += conn.opens > 0
                await conn.open()
            status, data, close = await asyncio.wait_for(conn.exchange(body), REQUEST_TIMEOUT)
        except Stale:
            conn.close()
            if attempt == 1:
                stats.retried_stale += 1
                continue
            stats.fail("closed_before_answer", "twice")
            return
        except asyncio.TimeoutError:
            conn.close()
            stats.fail("timeout")
            return
        except (ConnectionError, OSError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
            conn.close()
            stats.fail(f"connection:{type(e).__name__}", f"{e} (connection had served {conn.served})")
            return
        if close:
            conn.close()
        break
    stats.latencies.append(time.monotonic() - start)
    if status != 200:
        stats.fail(f"http_{status}", data[:200].decode("utf-8", "replace"))
        return
    try:
        msg = json.loads(data)
    except ValueError:
        stats.fail("bad_json", data[:200].decode("utf-8", "replace"))
        return
    if "error" in msg:
        stats.fail(f"jsonrpc_{msg['error'].get('code')}", json.dumps(msg["error"])[:200])
    elif msg.get("result", {}).get("content", [{}])[0].get("text") != str(i + 1):
        stats.fail("wrong_result", json.dumps(msg)[:200])
    else:
        stats.ok += 1


async def worker(n: int, port: int, interval: float, stats: Stats, stop: asyncio.Event, ready: asyncio.Event | None) -> None:
    conn = Conn(port, stats)
    if ready is not None:
        try:
            await conn.open()
        except (ConnectionError, OSError, asyncio.TimeoutError) as e:
            stats.fail(f"connect:{type(e).__name__}", str(e))
        await ready.wait()
    i = n * 1_000_000
    # Spread the connections' first requests over one interval.
    await asyncio.sleep(interval * (n % 97) / 97)
    while not stop.is_set():
        i += 1
        await one_request(conn, stats, i)
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except asyncio.TimeoutError:
            pass
    conn.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between a connection's requests")
    ap.add_argument("--duration", type=float, default=600, help="upper bound; SIGTERM stops earlier")
    ap.add_argument("--hold", action="store_true", help="open every connection before sending")
    args = ap.parse_args()
    stats = Stats()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.call_later(args.duration, stop.set)
    ready = asyncio.Event() if args.hold else None
    tasks = [asyncio.create_task(worker(n, args.port, args.interval, stats, stop, ready)) for n in range(args.connections)]
    if ready is not None:
        # Every worker opens its connection first: wait until each has tried.
        deadline = time.monotonic() + 60
        while stats.open + sum(v for k, v in stats.failures.items() if k.startswith("connect:")) < args.connections:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        print(json.dumps({"event": "connected", "open": stats.open}), flush=True)
        ready.set()
    else:
        print(json.dumps({"event": "started"}), flush=True)
    await asyncio.gather(*tasks)
    print(json.dumps(stats.summary()), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
