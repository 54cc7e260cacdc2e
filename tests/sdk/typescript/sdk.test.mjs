// The official MCP TypeScript SDK client (@modelcontextprotocol/sdk) against a running
// quiver-server: initialize, paginated tools/list, every handler kind, list_changed.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { mkdtempSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import { BIN, freePort, waitUntil } from "./helpers.mjs";

let upstream, proc, dir, config, url, admin;

before(async () => {
  upstream = createServer((req, res) => {
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify({ path: req.url, ok: true }));
  });
  await new Promise((r) => upstream.listen(0, "127.0.0.1", r));
  const up = `http://127.0.0.1:${upstream.address().port}`;
  dir = mkdtempSync(join(tmpdir(), "quiver-ts-"));
  config = join(dir, "tools.yaml");
  writeFileSync(
    config,
    `server: {name: ts-test, pageSize: 2}
tools:
  - {name: add, handler: {builtin: add}}
  - {name: greet, input: {name: string}, handler: {template: "Hello {{name}}!"}}
  - name: add-then-greet
    input: {a: number, b: number}
    handler: {pipeline: [{tool: add}, {tool: greet, input: {name: "{{steps.0.text}}"}}]}
  - {name: rev, input: {text: string}, handler: {exec: {command: [/usr/bin/rev], stdin: "{{text}}"}}}
  - {name: lookup, input: {q: string}, handler: {http: {url: "${up}/search?q={{q}}"}}}
`,
  );
  const port = await freePort();
  const adminPort = await freePort();
  url = new URL(`http://127.0.0.1:${port}/mcp`);
  admin = `http://127.0.0.1:${adminPort}`;
  proc = spawn(BIN, ["--config", `file:${config}`, "--listen", `127.0.0.1:${port}`, "--admin-listen", `127.0.0.1:${adminPort}`], {
    stdio: ["ignore", "inherit", "inherit"],
  });
  await waitUntil(async () => (await fetch(`${admin}/readyz`)).ok);
});

after(async () => {
  proc?.kill("SIGTERM");
  upstream?.closeAllConnections();
  upstream?.close();
  rmSync(dir, { recursive: true, force: true });
});

async function connect() {
  const client = new Client({ name: "quiver-ts-test", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(url));
  return client;
}

async function allTools(client) {
  const names = [];
  let cursor;
  let pages = 0;
  for (let i = 0; i < 20; i++) {
    const page = await client.listTools(cursor ? { cursor } : {});
    pages++;
    names.push(...page.tools.map((t) => t.name));
    cursor = page.nextCursor;
    if (!cursor) break;
  }
  return { names, pages };
}

test("initialize and paginated tools/list", async () => {
  const client = await connect();
  try {
    assert.equal(client.getServerVersion().name, "ts-test");
    assert.equal(client.getServerCapabilities().tools.listChanged, true);
    const { names, pages } = await allTools(client);
    assert.deepEqual(names, ["add", "greet", "add-then-greet", "rev", "lookup"]);
    assert.equal(pages, 3);
  } finally {
    await client.close();
  }
});

test("every handler kind answers", async () => {
  const client = await connect();
  try {
    const add = await client.callTool({ name: "add", arguments: { a: 1.5, b: 2 } });
    assert.equal(add.content[0].text, "3.5");
    assert.deepEqual(add.structuredContent, { result: 3.5 });
    assert.equal((await client.callTool({ name: "greet", arguments: { name: "Lin" } })).content[0].text, "Hello Lin!");
    assert.equal((await client.callTool({ name: "add-then-greet", arguments: { a: 1, b: 1 } })).content[0].text, "Hello 2!");
    assert.equal((await client.callTool({ name: "rev", arguments: { text: "quiver" } })).content[0].text.trim(), "reviuq");
    const http = await client.callTool({ name: "lookup", arguments: { q: "a b" } });
    assert.deepEqual(http.structuredContent, { path: "/search?q=a%20b", ok: true });
    const bad = await client.callTool({ name: "greet", arguments: {} });
    assert.equal(bad.isError, true);
    assert.match(bad.content[0].text, /missing required property `name`/);
  } finally {
    await client.close();
  }
});

test("tools/list_changed arrives after the config file is edited", async () => {
  const client = await connect();
  try {
    let changed;
    const notified = new Promise((r) => (changed = r));
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => changed());
    await waitUntil(async () => (await (await fetch(`${admin}/metrics`)).text()).includes("quiver_open_streams 1"));
    const start = performance.now();
    writeFileSync(config, readFileSync(config, "utf8").replace("tools:\n", "tools:\n  - {name: added, handler: {template: from ts}}\n"));
    await Promise.race([notified, new Promise((_, no) => setTimeout(() => no(new Error("no list_changed in 10 s")), 10000))]);
    console.log(`file edit -> tools/list_changed received by the TypeScript SDK: ${(performance.now() - start).toFixed(1)} ms`);
    const { names } = await allTools(client);
    assert.equal(names[0], "added");
    assert.equal((await client.callTool({ name: "added", arguments: {} })).content[0].text, "from ts");
  } finally {
    await client.close();
  }
});
