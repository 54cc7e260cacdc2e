// Benchmark peer: the official MCP TypeScript SDK v2 (split packages @modelcontextprotocol/server,
// /node, /express; exact versions in package.json / package-lock.json) serving one `echo` tool at
// /mcp.
//
// Usage: node bench/peers/typescript-v2/server.mjs --port N   (listens on 127.0.0.1:N only)
// Install: (cd bench/peers/typescript-v2 && npm ci --no-audit --no-fund)
//
// What the SDK's docs recommend, and what this file does:
// - The v2 serving guide ("Serve with Express", docs/serving/express.md) recommends
//   `createMcpExpressApp()` (express + express.json() + Host/Origin validation for 127.0.0.1) with
//   one route `app.all('/mcp', ...)` over `toNodeHandler(createMcpHandler(factory))`. The factory
//   builds a fresh McpServer for every request; there are no sessions. We keep that shape.
// - `createMcpHandler` serves the 2026-07-28 revision and, by default (`legacy: 'stateless'`),
//   answers 2025-era requests — such as the benchmark's bare 2025-06-18 `tools/call` — from a fresh
//   server over a stateless transport built with only `sessionIdGenerator: undefined`. That
//   default legacy leg has no JSON option: it answers with `Content-Type: text/event-stream` (one
//   SSE `message` event), and `responseMode: 'json'` only shapes modern (2026-07-28) exchanges.
// - To get plain JSON for 2025-era requests too, we use the composition the docs give for a custom
//   legacy leg (docs/serving/legacy-clients.md, "Keep a sessionful 2025 deployment running"):
//   `isLegacyRequest(request)` in front of a strict `createMcpHandler(factory, { legacy: 'reject' })`.
//   Our legacy leg is the SDK's own stateless fallback with one change, `enableJsonResponse: true`:
//   per request, a new McpServer and a new WebStandardStreamableHTTPServerTransport
//   ({ sessionIdGenerator: undefined, enableJsonResponse: true }), both closed after the reply.
//   Modern requests go to the strict handler with `responseMode: 'json'` (the SDK prints a one-line
//   warning at startup that this drops mid-call notifications; the echo tool sends none).
// - No `initialize` is needed before `tools/call` (stateless legacy serving answers it directly).
// - GET /healthz answers 200 "ok" (plain express route, outside MCP). No per-request logging;
//   errors only. SIGTERM/SIGINT close the listener and keep-alive connections, then exit 0.

import { parseArgs } from 'node:util';
import { createMcpExpressApp } from '@modelcontextprotocol/express';
import { toNodeHandler } from '@modelcontextprotocol/node';
import {
    createMcpHandler,
    isLegacyRequest,
    McpServer,
    WebStandardStreamableHTTPServerTransport
} from '@modelcontextprotocol/server';
import * as z from 'zod/v4';

const { values } = parseArgs({ options: { port: { type: 'string' } } });
const port = Number(values.port);
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
    console.error('usage: node server.mjs --port N');
    process.exit(2);
}
const HOST = '127.0.0.1';

// One factory for both protocol eras, as the docs ask.
function buildServer() {
    const server = new McpServer({ name: 'bench-peer-typescript-v2', version: '1.0.0' });
    server.registerTool(
        'echo',
        {
            description: 'Returns its input text unchanged',
            inputSchema: z.object({ text: z.string() })
        },
        async ({ text }) => ({ content: [{ type: 'text', text }] })
    );
    return server;
}

const onerror = error => console.error('MCP error:', error);

// 2026-07-28 traffic: the SDK's entry, strict (legacy requests never reach it), JSON replies.
const modern = createMcpHandler(buildServer, { legacy: 'reject', responseMode: 'json', onerror });

// 2025-era traffic: stateless, one server + transport per request, JSON replies.
async function legacyJson(request, options) {
    if (request.method.toUpperCase() !== 'POST') {
        return Response.json(
            { jsonrpc: '2.0', error: { code: -32000, message: 'Method not allowed.' }, id: null },
            { status: 405 }
        );
    }
    const server = buildServer();
    const transport = new WebStandardStreamableHTTPServerTransport({
        sessionIdGenerator: undefined,
        enableJsonResponse: true
    });
    try {
        await server.connect(transport);
        return await transport.handleRequest(request, options);
    } finally {
        transport.close().catch(() => {});
        server.close().catch(() => {});
    }
}

const handler = {
    fetch: async (request, options) =>
        (await isLegacyRequest(request, options?.parsedBody)) ? legacyJson(request, options) : modern.fetch(request, options)
};
const node = toNodeHandler(handler, { onerror });

const app = createMcpExpressApp({ host: HOST });
app.get('/healthz', (_req, res) => {
    res.type('text/plain').send('ok');
});
app.all('/mcp', (req, res) => void node(req, res, req.body));

const httpServer = app.listen(port, HOST, error => {
    if (error) {
        console.error('failed to listen:', error);
        process.exit(1);
    }
    console.log(`typescript-v2 peer (@modelcontextprotocol/server 2.x) listening on http://${HOST}:${port}/mcp`);
});

function shutdown() {
    modern.close().catch(() => {});
    httpServer.close(() => process.exit(0));
    httpServer.closeAllConnections();
    setTimeout(() => process.exit(0), 2000).unref();
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
