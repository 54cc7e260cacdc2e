// Benchmark peer: the official MCP TypeScript SDK 1.x (@modelcontextprotocol/sdk, pinned in
// package.json / package-lock.json) serving one `echo` tool over Streamable HTTP at /mcp.
//
// Usage: node bench/peers/typescript-v1/server.mjs --port N   (listens on 127.0.0.1:N only)
// Install: (cd bench/peers/typescript-v1 && npm ci --no-audit --no-fund)
//
// What the SDK's docs recommend, and what this file does:
// - The SDK's stateless example (src/examples/server/simpleStatelessStreamableHttp.ts, linked from
//   its README and docs/server.md) builds the app with `createMcpExpressApp()` (express + JSON body
//   parser + DNS-rebinding Host validation for 127.0.0.1) and, for every POST /mcp, creates a NEW
//   McpServer and a NEW StreamableHTTPServerTransport({ sessionIdGenerator: undefined }), connects
//   them, calls `transport.handleRequest(req, res, req.body)` and closes both when the response
//   closes; GET and DELETE /mcp answer 405. We do exactly that.
// - A stateless transport cannot be shared: since 1.26 the SDK throws "Stateless transport cannot be
//   reused across requests. Create a new transport per request." So per-request server+transport is
//   not a choice of ours, it is the only supported stateless setup.
// - JSON responses instead of SSE: `enableJsonResponse: true` (the SDK's jsonResponseStreamableHttp.ts
//   example / "JSON response mode" in docs/server.md).
// - In stateless mode the SDK does not require `initialize` before `tools/call`; the benchmark's
//   bare tools/call is answered directly.
// - GET /healthz answers 200 "ok" (plain express route, outside MCP).
// - No per-request logging; errors only. SIGTERM/SIGINT close the listener and keep-alive
//   connections, then exit 0.

import { parseArgs } from 'node:util';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import * as z from 'zod/v4';

const { values } = parseArgs({ options: { port: { type: 'string' } } });
const port = Number(values.port);
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
    console.error('usage: node server.mjs --port N');
    process.exit(2);
}
const HOST = '127.0.0.1';

function buildServer() {
    const server = new McpServer({ name: 'bench-peer-typescript-v1', version: '1.0.0' });
    server.registerTool(
        'echo',
        {
            description: 'Returns its input text unchanged',
            inputSchema: { text: z.string() }
        },
        async ({ text }) => ({ content: [{ type: 'text', text }] })
    );
    return server;
}

const methodNotAllowed = JSON.stringify({
    jsonrpc: '2.0',
    error: { code: -32000, message: 'Method not allowed.' },
    id: null
});

const app = createMcpExpressApp({ host: HOST });

app.get('/healthz', (_req, res) => {
    res.type('text/plain').send('ok');
});

app.post('/mcp', async (req, res) => {
    const server = buildServer();
    const transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: undefined,
        enableJsonResponse: true
    });
    res.on('close', () => {
        transport.close();
        server.close();
    });
    try {
        await server.connect(transport);
        await transport.handleRequest(req, res, req.body);
    } catch (error) {
        console.error('error handling MCP request:', error);
        if (!res.headersSent) {
            res.status(500).json({
                jsonrpc: '2.0',
                error: { code: -32603, message: 'Internal server error' },
                id: null
            });
        }
    }
});

app.get('/mcp', (_req, res) => {
    res.writeHead(405, { 'Content-Type': 'application/json' }).end(methodNotAllowed);
});
app.delete('/mcp', (_req, res) => {
    res.writeHead(405, { 'Content-Type': 'application/json' }).end(methodNotAllowed);
});

const httpServer = app.listen(port, HOST, error => {
    if (error) {
        console.error('failed to listen:', error);
        process.exit(1);
    }
    console.log(`typescript-v1 peer (@modelcontextprotocol/sdk 1.x) listening on http://${HOST}:${port}/mcp`);
});

function shutdown() {
    httpServer.close(() => process.exit(0));
    httpServer.closeAllConnections();
    setTimeout(() => process.exit(0), 2000).unref();
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
