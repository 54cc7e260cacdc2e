// An MCP server written with the official TypeScript SDK (@modelcontextprotocol/sdk), for
// quiver-server to front as an upstream: `node ts-upstream.mjs stdio` or
// `node ts-upstream.mjs http PORT` (stateless Streamable HTTP with JSON answers, a fresh
// server per request, as the SDK documents for horizontally scaled deployments).
import { createServer } from "node:http";
import { McpServer, ResourceTemplate } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

const [mode, port] = process.argv.slice(2);

function build() {
  const server = new McpServer({ name: "ts-upstream", version: "1.0.0" });
  const text = (t) => ({ content: [{ type: "text", text: t }] });
  server.registerTool(
    "echo",
    { description: "Returns the text.", inputSchema: { text: z.string() } },
    async ({ text: t }) => text(t),
  );
  server.registerTool(
    "add",
    { description: "Adds two integers.", inputSchema: { a: z.number().int(), b: z.number().int() } },
    async ({ a, b }) => text(String(a + b)),
  );
  server.registerTool(
    "whoami",
    { description: "The serving process and transport." },
    async () => text(`pid=${process.pid} transport=${mode}`),
  );
  // The same URIs and prompt name whatever the transport: the gateway keeps them apart.
  server.registerResource(
    "guide",
    "file:///guide.md",
    { mimeType: "text/markdown", description: "The guide." },
    async (uri) => ({ contents: [{ uri: uri.href, text: `# guide over ${mode}` }] }),
  );
  server.registerResource(
    "chapter",
    new ResourceTemplate("book://{title}", { list: undefined }),
    { mimeType: "text/plain" },
    async (uri, { title }) => ({ contents: [{ uri: uri.href, text: `${title} over ${mode}` }] }),
  );
  server.registerPrompt(
    "summarize",
    { description: "Summarize a text.", argsSchema: { text: z.string() } },
    ({ text: t }) => ({ messages: [{ role: "user", content: { type: "text", text: `Summarize (${mode}): ${t}` } }] }),
  );
  return server;
}

if (mode === "stdio") {
  await build().connect(new StdioServerTransport());
} else {
  createServer(async (req, res) => {
    if (req.method !== "POST") {
      res.writeHead(405).end();
      return;
    }
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    const server = build();
    res.on("close", () => {
      transport.close();
      server.close();
    });
    await server.connect(transport);
    await transport.handleRequest(req, res, JSON.parse(Buffer.concat(chunks).toString()));
  }).listen(Number(port), "127.0.0.1");
}
