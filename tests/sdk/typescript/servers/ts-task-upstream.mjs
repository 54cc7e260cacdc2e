// An MCP server written with the official TypeScript SDK whose tools run only as tasks
// (`execution.taskSupport: required`), for quiver-server to front: `node ts-task-upstream.mjs
// http PORT` (Streamable HTTP with sessions) or `node ts-task-upstream.mjs stdio`. Its tasks
// live in the SDK's in-memory task store; their questions to the user (elicitation) wait in
// the SDK's task message queue until the client reads `tasks/result`.
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { InMemoryTaskMessageQueue, InMemoryTaskStore } from "@modelcontextprotocol/sdk/experimental/tasks";
import { ElicitResultSchema } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const [mode, port] = process.argv.slice(2);
const taskStore = new InMemoryTaskStore();
const taskMessageQueue = new InMemoryTaskMessageQueue();
// What each task was told when it ended early (cancelled), for the `cancelled` tool.
const seen = { cancelled: [] };

const text = (t) => ({ content: [{ type: "text", text: t }] });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function build() {
  const server = new McpServer(
    { name: "ts-task-upstream", version: "1.0.0" },
    {
      capabilities: { tasks: { requests: { tools: { call: {} } }, list: {}, cancel: {} } },
      taskStore,
      taskMessageQueue,
    },
  );
  const handlers = (work) => ({
    createTask: async (args, extra) => {
      const task = await extra.taskStore.createTask({ ttl: extra.taskRequestedTtl ?? 60000, pollInterval: 100 });
      (async () => {
        let status = "completed";
        let result;
        try {
          result = await work(args, extra, task.taskId);
        } catch (e) {
          [status, result] = ["failed", { ...text(String(e)), isError: true }];
        }
        // A task cancelled meanwhile keeps its status (the store refuses a result for it).
        if (result) await extra.taskStore.storeTaskResult(task.taskId, status, result).catch(() => {});
      })();
      return { task };
    },
    getTask: async (_args, extra) => extra.taskStore.getTask(extra.taskId),
    getTaskResult: async (_args, extra) => extra.taskStore.getTaskResult(extra.taskId),
  });
  server.experimental.tasks.registerToolTask(
    "report",
    { description: "Writes a report, which takes a moment.", inputSchema: { topic: z.string() }, execution: { taskSupport: "required" } },
    handlers(async ({ topic }) => {
      await sleep(300);
      return text(`report on ${topic}`);
    }),
  );
  server.experimental.tasks.registerToolTask(
    "confirm_delete",
    { description: "Asks the user before deleting a file.", inputSchema: { file: z.string() }, execution: { taskSupport: "required" } },
    handlers(async ({ file }, extra, taskId) => {
      const answer = await extra.sendRequest(
        {
          method: "elicitation/create",
          params: {
            message: `Delete ${file}?`,
            requestedSchema: { type: "object", properties: { confirm: { type: "boolean" } }, required: ["confirm"] },
          },
        },
        ElicitResultSchema,
        { relatedTask: { taskId } },
      );
      await extra.taskStore.updateTaskStatus(taskId, "working");
      const yes = answer.action === "accept" && answer.content?.confirm === true;
      return text(yes ? `deleted ${file}` : `kept ${file}`);
    }),
  );
  server.experimental.tasks.registerToolTask(
    "forever",
    { description: "Works until it is cancelled.", inputSchema: { tag: z.string() }, execution: { taskSupport: "required" } },
    handlers(async ({ tag }, extra, taskId) => {
      for (;;) {
        await sleep(50);
        const t = await extra.taskStore.getTask(taskId);
        if (!t || t.status === "cancelled") {
          seen.cancelled.push(tag);
          return null;
        }
      }
    }),
  );
  server.registerTool("cancelled", { description: "The tags of the `forever` tasks cancelled so far." }, async () =>
    text(seen.cancelled.join(",")),
  );
  return server;
}

if (mode === "stdio") {
  await build().connect(new StdioServerTransport());
} else {
  const sessions = new Map();
  createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    const id = req.headers["mcp-session-id"];
    let transport = id ? sessions.get(id) : undefined;
    if (!transport) {
      if (id || req.method !== "POST" || body?.method !== "initialize") {
        res.writeHead(id ? 404 : 400).end();
        return;
      }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (sid) => sessions.set(sid, transport),
      });
      transport.onclose = () => transport.sessionId && sessions.delete(transport.sessionId);
      await build().connect(transport);
    }
    await transport.handleRequest(req, res, body);
  }).listen(Number(port), "127.0.0.1");
}
