// What the TypeScript SDK tests share: the server binary, free loopback ports, and polling.
import { createServer } from "node:http";
import { join, resolve } from "node:path";

export const ROOT = resolve(import.meta.dirname, "../../..");
export const BIN = process.env.QUIVER_SERVER_BIN ?? join(ROOT, "target/debug/quiver-server");

export async function freePort() {
  return new Promise((ok) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

/** Polls `fn` until it returns something truthy; fails with the last error after `timeoutMs`. */
export async function waitUntil(fn, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`condition not met in ${timeoutMs} ms: ${last}`);
}
