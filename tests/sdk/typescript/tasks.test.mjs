// Tasks of protocol 2025-11-25 driven by the official MCP TypeScript SDK client
// (client.experimental.tasks) against the real quiver-server: capabilities and each tool's
// taskSupport, callToolStream (create, poll, result), getTask, listTasks (only the caller's
// own tasks), cancelTask, getTaskResult, required and forbidden tools, a failing tool.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";
import { BIN, freePort, waitUntil } from "./helpers.mjs";

const RELATED = "io.modelcontextprotocol/related-task";
let proc, dir, url;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "quiver-ts-tasks-"));
  const config = join(dir, "tools.yaml");
  writeFileSync(
    config,
    `server: {name: ts-tasks}
tools:
  - {name: slow, input: {secs: string}, handler: {exec: {command: [/bin/sh, -c, 'sleep "$1"; echo "slept $1"', sh, "{{secs}}"]}}}
  - {name: nap, handler: {exec: {command: [/bin/sleep, "60"], timeout: 5m}}}
  - {name: broken, handler: {exec: {command: [/bin/sh, -c, "echo no luck >&2; exit 4"]}}}
  - {name: job, task: required, handler: {exec: {command: [/bin/echo, job done]}}}
  - {name: quick, task: forbidden, handler: {exec: {command: [/bin/echo, quick]}}}
  - {name: hello, handler: {template: hi}}
`,
  );
  const port = await freePort();
  const adminPort = await freePort();
  url = new URL(`http://127.0.0.1:${port}/mcp`);
  proc = spawn(BIN, ["--config", `file:${config}`, "--listen", `127.0.0.1:${port}`, "--admin-listen", `127.0.0.1:${adminPort}`, "--tasks-ttl", "2m"], {
    stdio: ["ignore", "inherit", "inherit"],
  });
  await waitUntil(async () => (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).ok);
});

after(() => {
  proc?.kill("SIGTERM");
  rmSync(dir, { recursive: true, force: true });
});

async function connect() {
  const client = new Client({ name: "quiver-ts-tasks", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(url));
  return client;
}

/** Every message of a callToolStream, in order. */
async function stream(client, params, options) {
  const seen = [];
  for await (const m of client.experimental.tasks.callToolStream(params, CallToolResultSchema, options)) seen.push(m);
  return seen;
}

async function allTasks(client) {
  const ids = [];
  let cursor;
  for (let i = 0; i < 20; i++) {
    const page = await client.experimental.tasks.listTasks(cursor);
    ids.push(...page.tasks.map((t) => t.taskId));
    cursor = page.nextCursor;
    if (!cursor) break;
  }
  return ids;
}

test("capabilities and each tool's taskSupport", async () => {
  const client = await connect();
  try {
    assert.deepEqual(client.getServerCapabilities().tasks, { list: {}, cancel: {}, requests: { tools: { call: {} } } });
    const { tools } = await client.listTools();
    const support = Object.fromEntries(tools.map((t) => [t.name, t.execution?.taskSupport ?? null]));
    assert.deepEqual(support, { slow: "optional", nap: "optional", broken: "optional", job: "required", quick: null, hello: null });
  } finally {
    await client.close();
  }
});

test("callToolStream creates a task, polls it and gets its result", async () => {
  const client = await connect();
  try {
    const seen = await stream(client, { name: "slow", arguments: { secs: "0.3" } }, { task: { ttl: 45000 } });
    assert.equal(seen[0].type, "taskCreated");
    assert.equal(seen[0].task.status, "working");
    assert.equal(seen[0].task.ttl, 45000);
    const last = seen.at(-1);
    assert.equal(last.type, "result", JSON.stringify(seen));
    assert.equal(last.result.content[0].text.trim(), "slept 0.3");
    const id = seen[0].task.taskId;
    assert.equal(last.result._meta[RELATED].taskId, id);
    assert.ok(seen.some((m) => m.type === "taskStatus" && m.task.status === "completed"));
    const t = await client.experimental.tasks.getTask(id);
    assert.equal(t.status, "completed");
    // After a listTools, a tool whose taskSupport is required is task-augmented on its own.
    await client.listTools();
    const job = await stream(client, { name: "job", arguments: {} });
    assert.equal(job[0].type, "taskCreated");
    assert.equal(job.at(-1).result.content[0].text.trim(), "job done");
    // getTaskResult waits for a task still running.
    const waiting = await stream(client, { name: "slow", arguments: { secs: "0.5" } }, { task: {} });
    const res = await client.experimental.tasks.getTaskResult(waiting[0].task.taskId, CallToolResultSchema);
    assert.equal(res.content[0].text.trim(), "slept 0.5");
    assert.equal(waiting[0].task.ttl, 120000, "no ttl asked: the server's --tasks-ttl");
  } finally {
    await client.close();
  }
});

test("listTasks shows only the caller's own tasks; others' ids are unknown", async () => {
  const a = await connect();
  const b = await connect();
  try {
    // callToolStream would poll the 60 s nap to its end: create with a raw task-augmented call.
    const create = async (client) => {
      const it = client.experimental.tasks.callToolStream({ name: "nap", arguments: {} }, CallToolResultSchema, { task: {} });
      const first = await it.next();
      await it.return?.();
      assert.equal(first.value.type, "taskCreated");
      return first.value.task.taskId;
    };
    const mine = await create(a);
    const theirs = await create(b);
    const listedA = await allTasks(a);
    const listedB = await allTasks(b);
    assert.ok(listedA.includes(mine) && !listedA.includes(theirs));
    assert.deepEqual(listedB, [theirs]);
    for (const op of [
      () => b.experimental.tasks.getTask(mine),
      () => b.experimental.tasks.cancelTask(mine),
      () => b.experimental.tasks.getTaskResult(mine, CallToolResultSchema),
    ]) {
      await assert.rejects(op, (e) => e.code === -32602);
    }
    assert.equal((await a.experimental.tasks.getTask(mine)).status, "working");
    for (const [client, id] of [
      [a, mine],
      [b, theirs],
    ]) {
      const cancelled = await client.experimental.tasks.cancelTask(id);
      assert.equal(cancelled.status, "cancelled");
      assert.equal(cancelled.taskId, id);
      await assert.rejects(client.experimental.tasks.cancelTask(id), (e) => e.code === -32602);
    }
  } finally {
    await a.close();
    await b.close();
  }
});

test("required and forbidden tools, and a failing tool", async () => {
  const client = await connect();
  try {
    await assert.rejects(client.callTool({ name: "job", arguments: {} }), (e) => e.code === -32601 && /Task augmentation required/.test(e.message));
    for (const name of ["quick", "hello"]) {
      const seen = await stream(client, { name, arguments: {} }, { task: {} });
      assert.equal(seen.at(-1).type, "error");
      assert.equal(seen.at(-1).error.code, -32601);
    }
    const failing = await stream(client, { name: "broken", arguments: {} }, { task: {} });
    assert.equal(failing.at(-1).type, "error");
    assert.match(failing.at(-1).error.message, /failed/);
    const id = failing[0].task.taskId;
    const t = await client.experimental.tasks.getTask(id);
    assert.equal(t.status, "failed");
    assert.ok(t.statusMessage);
    const res = await client.experimental.tasks.getTaskResult(id, CallToolResultSchema);
    assert.equal(res.isError, true);
    assert.equal(res._meta[RELATED].taskId, id);
  } finally {
    await client.close();
  }
});
