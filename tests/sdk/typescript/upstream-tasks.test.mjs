// quiver-server fronting an MCP server written with the official TypeScript SDK whose tools
// run only as tasks (its in-memory task store), driven by the official TypeScript client:
// a plain call is served by following the upstream's task, and the task's question to the
// user reaches this client's elicitation handler.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { BIN, freePort, waitUntil } from "./helpers.mjs";

const UPSTREAM = join(import.meta.dirname, "servers", "ts-task-upstream.mjs");

let dir, quiver, upstream, url;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "quiver-ts-upstream-tasks-"));
  const upPort = await freePort();
  upstream = spawn(process.execPath, [UPSTREAM, "http", String(upPort)], { stdio: "inherit" });
  const config = join(dir, "tools.yaml");
  writeFileSync(
    config,
    `upstreams:
  - name: jobs
    http: {url: "http://127.0.0.1:${upPort}/mcp"}
    tools: {prefix: t_, tasks: {report: optional, confirm_delete: optional}}
`,
  );
  const port = await freePort();
  const admin = await freePort();
  quiver = spawn(BIN, ["--config", `file:${config}`, "--listen", `127.0.0.1:${port}`, "--admin-listen", `127.0.0.1:${admin}`], {
    stdio: ["ignore", "ignore", "inherit"],
    env: { ...process.env, RUST_LOG: "warn" },
  });
  url = new URL(`http://127.0.0.1:${port}/mcp`);
  await waitUntil(async () => {
    const s = await (await fetch(`http://127.0.0.1:${admin}/status`)).json();
    return s.upstreams.length === 1 && s.upstreams[0].state === "ready" && s.tools === 4;
  });
});

after(() => {
  quiver?.kill();
  upstream?.kill();
  rmSync(dir, { recursive: true, force: true });
});

test("a tool the upstream runs only as a task answers a plain call, its question answered by this client", async () => {
  const client = new Client({ name: "ts-upstream-tasks-test", version: "1.0.0" }, { capabilities: { elicitation: {} } });
  const asked = [];
  client.setRequestHandler(ElicitRequestSchema, async (req) => {
    asked.push(req.params.message);
    return { action: "accept", content: { confirm: true } };
  });
  await client.connect(new StreamableHTTPClientTransport(url));
  try {
    const report = await client.callTool({ name: "t_report", arguments: { topic: "q1" } });
    assert.equal(report.content[0].text, "report on q1");
    const deleted = await client.callTool({ name: "t_confirm_delete", arguments: { file: "b.txt" } });
    assert.equal(deleted.isError ?? false, false, JSON.stringify(deleted));
    assert.equal(deleted.content[0].text, "deleted b.txt");
    assert.deepEqual(asked, ["Delete b.txt?"]);
  } finally {
    await client.close();
  }
});
