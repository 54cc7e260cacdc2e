// quiver-server fronting MCP servers written with the official TypeScript SDK, over stdio
// (a process quiver-server runs) and stateless Streamable HTTP, driven by the official
// TypeScript client.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { BIN, freePort, waitUntil } from "./helpers.mjs";

const UPSTREAM = join(import.meta.dirname, "servers", "ts-upstream.mjs");

let dir, quiver, upstream, url, admin;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "quiver-ts-upstream-"));
  const upPort = await freePort();
  upstream = spawn(process.execPath, [UPSTREAM, "http", String(upPort)], { stdio: "inherit" });
  const config = join(dir, "tools.yaml");
  writeFileSync(
    config,
    `tools: [{name: local, handler: {template: local}}]
upstreams:
  - {name: ts-stdio, stdio: {command: [${JSON.stringify(process.execPath)}, ${JSON.stringify(UPSTREAM)}, stdio]}, tools: {prefix: s_}, resources: {}, prompts: {prefix: s_}}
  - {name: ts-http, http: {url: "http://127.0.0.1:${upPort}/mcp"}, tools: {prefix: h_}, resources: {}, prompts: {prefix: h_}}
`,
  );
  const port = await freePort();
  admin = await freePort();
  quiver = spawn(BIN, ["--config", `file:${config}`, "--listen", `127.0.0.1:${port}`, "--admin-listen", `127.0.0.1:${admin}`], {
    stdio: ["ignore", "ignore", "inherit"],
    env: { ...process.env, RUST_LOG: "warn" },
  });
  url = new URL(`http://127.0.0.1:${port}/mcp`);
  await waitUntil(async () => {
    const s = await (await fetch(`http://127.0.0.1:${admin}/status`)).json();
    return (
      s.upstreams.length === 2 &&
      s.upstreams.every((u) => u.state === "ready" && u.imported === 3 && u.resources === 2 && u.prompts === 1) &&
      s.tools === 7
    );
  });
});

after(() => {
  quiver?.kill();
  upstream?.kill();
  rmSync(dir, { recursive: true, force: true });
});

test("TypeScript SDK servers over stdio and HTTP serve beside a local tool", async () => {
  const client = new Client({ name: "ts-upstream-test", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(url));
  try {
    const { tools } = await client.listTools();
    assert.deepEqual(
      tools.map((t) => t.name).sort(),
      ["h_add", "h_echo", "h_whoami", "local", "s_add", "s_echo", "s_whoami"],
    );
    const add = await client.callTool({ name: "s_add", arguments: { a: 20, b: 22 } });
    assert.equal(add.content[0].text, "42");
    const who = await client.callTool({ name: "h_whoami", arguments: {} });
    assert.match(who.content[0].text, /transport=http/);
    const stdio = await client.callTool({ name: "s_whoami", arguments: {} });
    assert.match(stdio.content[0].text, /transport=stdio/);
    // Quiver checks the upstream's schema before forwarding (z.number().int()).
    const bad = await client.callTool({ name: "h_add", arguments: { a: 1.5, b: 1 } });
    assert.equal(bad.isError, true);
    assert.match(bad.content[0].text, /arguments\.a/);
  } finally {
    await client.close();
  }
});

test("the TypeScript client reads both upstreams' resources and prompts apart", async () => {
  const client = new Client({ name: "ts-offers-test", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(url));
  try {
    const { resources } = await client.listResources();
    assert.deepEqual(resources.map((r) => r.uri).sort(), ["ts-http+file:///guide.md", "ts-stdio+file:///guide.md"]);
    const { resourceTemplates } = await client.listResourceTemplates();
    assert.deepEqual(resourceTemplates.map((t) => t.uriTemplate).sort(), ["ts-http+book://{title}", "ts-stdio+book://{title}"]);
    for (const [up, mode] of [["ts-stdio", "stdio"], ["ts-http", "http"]]) {
      const guide = await client.readResource({ uri: `${up}+file:///guide.md` });
      assert.deepEqual(guide.contents.map((c) => [c.uri, c.text]), [[`${up}+file:///guide.md`, `# guide over ${mode}`]]);
      const chapter = await client.readResource({ uri: `${up}+book://dune` });
      assert.equal(chapter.contents[0].text, `dune over ${mode}`);
    }
    const { prompts } = await client.listPrompts();
    assert.deepEqual(prompts.map((p) => p.name).sort(), ["h_summarize", "s_summarize"]);
    const got = await client.getPrompt({ name: "h_summarize", arguments: { text: "a story" } });
    assert.equal(got.messages[0].content.text, "Summarize (http): a story");
    await assert.rejects(client.readResource({ uri: "ts-http+file:///../guide.md" }), /not found/i);
  } finally {
    await client.close();
  }
});
