// The official MCP TypeScript SDK client drives the server-to-client side of the protocol
// against the real quiver-server: progress of a pipeline, log messages filtered by
// logging/setLevel, a resource subscription answered when the config changes the resource,
// and a sampling request the client answers.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  CreateMessageRequestSchema,
  LoggingMessageNotificationSchema,
  ResourceUpdatedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { BIN, freePort, waitUntil } from "./helpers.mjs";

let proc, dir, config, url;

const tools = (motd) => `server: {name: ts-interop}
tools:
  - {name: add, handler: {builtin: add}}
  - {name: greet, input: {name: string}, handler: {template: "Hello {{name}}!"}}
  - name: sum-and-greet
    input: {a: number, b: number}
    handler:
      pipeline:
        - {tool: add, log: "adding {{a}} and {{b}}", logLevel: info}
        - {tool: greet, input: {name: "{{steps.0.text}}"}, log: "greeting {{steps.0.text}}", logLevel: debug}
  - name: haiku
    input: {topic: string}
    handler: {sample: {prompt: "A haiku about {{topic}}", maxTokens: 60}}
resources:
  - {uri: "doc://motd", name: motd, text: "${motd}"}
`;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "quiver-ts-interop-"));
  config = join(dir, "tools.yaml");
  writeFileSync(config, tools("first"));
  const port = await freePort();
  const adminPort = await freePort();
  url = new URL(`http://127.0.0.1:${port}/mcp`);
  proc = spawn(BIN, ["--config", `file:${config}`, "--listen", `127.0.0.1:${port}`, "--admin-listen", `127.0.0.1:${adminPort}`], {
    stdio: ["ignore", "inherit", "inherit"],
  });
  await waitUntil(async () => (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).ok);
});

after(() => {
  proc?.kill("SIGTERM");
  rmSync(dir, { recursive: true, force: true });
});

async function connect(capabilities = {}) {
  const client = new Client({ name: "quiver-ts-interop", version: "1.0.0" }, { capabilities });
  await client.connect(new StreamableHTTPClientTransport(url));
  return client;
}

test("progress per step, and log messages at or above the level set", async () => {
  const client = await connect();
  try {
    const logs = [];
    client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => logs.push([n.params.level, n.params.data]));
    await client.setLoggingLevel("info");
    const progress = [];
    const r = await client.callTool({ name: "sum-and-greet", arguments: { a: 2, b: 3 } }, undefined, {
      onprogress: (p) => progress.push([p.progress, p.total, p.message]),
    });
    assert.equal(r.content[0].text, "Hello 5!");
    assert.deepEqual(progress, [
      [0, 2, "add"],
      [1, 2, "greet"],
      [2, 2, undefined],
    ]);
    assert.deepEqual(logs, [["info", "adding 2 and 3"]]);

    logs.length = 0;
    await client.setLoggingLevel("debug");
    await client.callTool({ name: "sum-and-greet", arguments: { a: 1, b: 1 } });
    assert.deepEqual(logs, [
      ["info", "adding 1 and 1"],
      ["debug", "greeting 2"],
    ]);
  } finally {
    await client.close();
  }
});

test("a subscribed resource reports its change", async () => {
  const client = await connect();
  try {
    const updated = [];
    client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => updated.push(n.params.uri));
    assert.equal((await client.readResource({ uri: "doc://motd" })).contents[0].text, "first");
    await client.subscribeResource({ uri: "doc://motd" });
    writeFileSync(config, tools("second"));
    await waitUntil(() => updated.length === 1);
    assert.deepEqual(updated, ["doc://motd"]);
    assert.equal((await client.readResource({ uri: "doc://motd" })).contents[0].text, "second");

    await client.unsubscribeResource({ uri: "doc://motd" });
    writeFileSync(config, tools("third"));
    await waitUntil(async () => (await client.readResource({ uri: "doc://motd" })).contents[0].text === "third");
    assert.deepEqual(updated, ["doc://motd"], "no update after unsubscribing");
  } finally {
    await client.close();
  }
});

test("a sample tool asks the client's model", async () => {
  const client = await connect({ sampling: {} });
  try {
    const asked = [];
    client.setRequestHandler(CreateMessageRequestSchema, async (req) => {
      asked.push(req.params);
      return { role: "assistant", content: { type: "text", text: "Pods hum softly" }, model: "ts-model", stopReason: "endTurn" };
    });
    const r = await client.callTool({ name: "haiku", arguments: { topic: "pods" } });
    assert.equal(r.isError ?? false, false, JSON.stringify(r.content));
    assert.equal(r.content[0].text, "Pods hum softly");
    assert.equal(r.structuredContent.model, "ts-model");
    assert.equal(asked.length, 1);
    assert.equal(asked[0].messages[0].content.text, "A haiku about pods");
    assert.equal(asked[0].maxTokens, 60);
  } finally {
    await client.close();
  }
});
