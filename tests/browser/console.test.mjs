// The console in a real browser: playwright-core (from npm, no browser download) driving
// Debian's Chromium (QUIVER_CHROMIUM). test_console.py starts what it reads (a control plane,
// Keycloak, an MCP server, Prometheus and the operator's console) and runs this file with:
//   QUIVER_CONSOLE     the console's base URL
//   QUIVER_PROMETHEUS  the Prometheus that scrapes the MCP server
//   QUIVER_NS_A/B      alice's namespace (the server `weather`) and the other (`secret`)
//   QUIVER_SCREENSHOTS where screenshots go
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const need = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run through tests/browser/test_console.py`);
  return v;
};
const base = need('QUIVER_CONSOLE');
const prometheus = need('QUIVER_PROMETHEUS');
const [nsA, nsB] = [need('QUIVER_NS_A'), need('QUIVER_NS_B')];
const shots = need('QUIVER_SCREENSHOTS');

// One browser per test, one context (cookies) per user. Every host but 127.0.0.1 is
// unresolvable, no proxy, nothing in the background: the test's traffic stays on loopback.
async function launch() {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/proxy/i.test(k)));
  return chromium.launch({
    executablePath: need('QUIVER_CHROMIUM'),
    headless: true,
    chromiumSandbox: false,
    env,
    args: [
      '--no-proxy-server',
      '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
      '--disable-gpu',
    ],
  });
}

async function until(what, check, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      const v = await check();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${what} did not hold within ${timeoutMs / 1000} s (last error: ${last})`);
}

const text = (page) => page.locator('body').innerText();
const count = (page, selector) => page.locator(selector).count();

// Opens the console, signs in on Keycloak's login form and returns the first page's text.
async function signIn(context, page, user) {
  await page.goto(`${base}/`);
  await page.waitForURL(/\/realms\/[^/]+\/protocol\/openid-connect\/auth/);
  await page.fill('#username', user);
  await page.fill('#password', `${user}-password`);
  await page.click('#kc-login');
  await page.waitForURL(`${base}/`);
  // The session is a cookie the page's scripts cannot read; no token reaches the browser.
  // (Keycloak's own cookies share the host 127.0.0.1: only the console's are looked at.)
  const ours = Object.fromEntries(
    (await context.cookies()).filter((c) => c.name.startsWith('quiver_console')).map((c) => [c.name, c]),
  );
  assert.ok(ours.quiver_console && ours.quiver_console_site, JSON.stringify(ours));
  assert.ok(Object.values(ours).every((c) => c.httpOnly), JSON.stringify(ours));
  assert.equal(ours.quiver_console_site.sameSite, 'Strict');
  assert.ok(!Object.values(ours).some((c) => c.value.includes('eyJ')), 'a token in a cookie');
  return text(page);
}

// A screenshot of the page from `selector`'s top (or the page's), at most `maxHeight` tall.
async function shot(page, name, { from, maxHeight } = {}) {
  const { top, height } = await page.evaluate((sel) => {
    const e = sel && document.querySelector(sel);
    const top = e ? e.getBoundingClientRect().top + window.scrollY : 0;
    return { top, height: document.documentElement.scrollHeight - top };
  }, from ?? null);
  const width = page.viewportSize().width;
  await page.screenshot({
    path: join(shots, name),
    fullPage: true,
    clip: { x: 0, y: top, width, height: Math.min(height, maxHeight ?? height) },
  });
}

async function promQuery(query) {
  const r = await fetch(`${prometheus}/api/v1/query?${new URLSearchParams({ query })}`);
  return (await r.json()).data.result;
}

async function result(page) {
  const handle = await page.waitForFunction(() => document.querySelector('#result')?.innerText);
  return handle.jsonValue();
}

test('a user browses their namespace, tries a tool and sees a refusal', async () => {
  const browser = await launch();
  try {
    const context = await browser.newContext({ viewport: { width: 1280, height: 1024 } });
    const page = await context.newPage();
    let body = await signIn(context, page, 'alice');
    if (!body.includes('weather')) {
      // The console's watch had not listed the McpServers yet ("Starting").
      body = await until("alice's server listed", async () => {
        await page.goto(`${base}/`);
        const t = await text(page);
        return t.includes('weather') && t;
      });
    }
    assert.ok(body.includes(nsA) && body.includes('Forecasts and greetings'), body);
    assert.ok(!body.includes('secret') && !body.includes(nsB), body);
    await shot(page, 'console-servers.png');

    // A link on another site (an opaque data: page) opens the server's page signed in, but
    // the same-site cookie stays behind: no listing with alice's token, a link instead.
    const link = `<a id=go href='${base}/servers/${nsA}/weather'>weather</a>`;
    await page.goto(`data:text/html,${encodeURIComponent(link)}`);
    await page.click('#go');
    await page.waitForURL(`${base}/servers/${nsA}/weather`);
    assert.ok((await text(page)).includes('followed a link from another site'));
    assert.equal(await count(page, "a[href$='/tools/greet']"), 0);

    // The server page: 1,002 tools listed with alice's own token, timed by the browser.
    await page.goto(`${base}/`);
    await page.click(`a[href='/servers/${nsA}/weather']`);
    await page.waitForURL(`${base}/servers/${nsA}/weather`);
    assert.equal(await count(page, "a[href$='/tools/greet']"), 1);
    assert.equal(await count(page, "a[href$='/tools/t0999']"), 1);
    const rows = await page.evaluate(() => document.querySelectorAll('main table tbody tr').length);
    const nav = await page.evaluate(() => JSON.stringify(performance.getEntriesByType('navigation')[0].toJSON()));
    const t = JSON.parse(nav);
    console.log(`server page with 1,002 tools: response ${(t.responseEnd - t.requestStart).toFixed(1)} ms, ` +
      `loaded ${(t.loadEventEnd - t.startTime).toFixed(1)} ms, ${t.transferSize} bytes`);
    writeFileSync(join(shots, 'console-timing.json'), nav);
    // deploy is for the group sre: not among alice's tools, but named under who may call what.
    assert.equal(await count(page, "a[href$='/tools/deploy']"), 0);
    body = await text(page);
    assert.ok(body.includes('callers with a member of sre'), body.slice(0, 2000));
    assert.ok(body.includes('claude mcp add --transport http weather'));
    assert.ok(rows >= 1002, `${rows} rows`);
    await shot(page, 'console-server.png', { maxHeight: 1400 });

    // Try greet through its form: the call carries alice's token and the result shows.
    await page.click("a[href$='/tools/greet']");
    await page.waitForURL(/\/tools\/greet$/);
    assert.equal(await count(page, "label[for='arg-name']"), 1);
    await page.fill('#arg-name', 'Alice <b>');
    await page.click("form[action$='/tools/greet'] button[type=submit]");
    const greeted = await result(page);
    assert.ok(greeted.includes('Hello, Alice <b>!'), greeted);
    assert.equal(await count(page, '#result b'), 0, "a tool's text must not become markup");
    await shot(page, 'console-try-it.png');

    // deploy, opened by its address: the page says why, and a call gets the server's refusal.
    await page.goto(`${base}/servers/${nsA}/weather/tools/deploy`);
    assert.ok((await text(page)).includes('does not list this tool to you'));
    await page.click("form[action$='/tools/deploy'] button[type=submit]");
    await page.waitForURL(/\/tools\/deploy/);
    const refusal = await result(page);
    assert.ok(refusal.includes('Refused') && refusal.includes('-32003'), refusal);
    await shot(page, 'console-refused.png');

    // The server's last hour, from Prometheus once it has scraped both calls: greet's call
    // in its row, deploy's refusal under the refusals. (A counter's increase needs two
    // scrapes after it appears: the page is read again until it shows both.)
    await until('Prometheus has both calls', async () =>
      (await promQuery('quiver_dispatch_duration_seconds_count{tool="greet"}')).length &&
      (await promQuery('quiver_requests_total{method="tools/call", outcome="forbidden"}')).length);
    const lastHour = async () => {
      await page.goto(`${base}/servers/${nsA}/weather`);
      return page.evaluate(() => ({
        greet: [...document.querySelectorAll('main tr')]
          .find((r) => r.querySelector("a[href$='/tools/greet']"))?.innerText ?? '',
        refused: [...document.querySelectorAll('main table')]
          .find((t) => t.caption && t.caption.innerText === 'Calls refused')?.innerText ?? '',
      }));
    };
    const { greet, refused } = await until('the page shows both calls', async () => {
      const seen = await lastHour();
      return seen.refused && /\t1\t/.test(seen.greet) && seen;
    });
    const cells = greet.split('\t').map((c) => c.trim());
    assert.deepEqual(cells.slice(-3, -1), ['1', '0'], greet);
    assert.match(cells.at(-1), /(µs|ms)$/, greet);
    assert.ok(refused.includes('forbidden\t1'), refused);
    await shot(page, 'console-last-hour.png', { from: '#health', maxHeight: 900 });

    // B's server is not there for alice, by any address.
    await page.goto(`${base}/servers/${nsB}/secret`);
    assert.ok((await text(page)).includes('No such server'));
  } finally {
    await browser.close();
  }
});

test('a user without a grant sees no server and a forged form is refused', async () => {
  const browser = await launch();
  try {
    const context = await browser.newContext();
    const page = await context.newPage();
    const body = await signIn(context, page, 'bob');
    assert.ok(!body.includes('weather') && !body.includes('secret'), body);
    assert.ok(body.includes('may not list McpServers'), body);
    await page.goto(`${base}/servers/${nsA}/weather`);
    assert.ok((await text(page)).includes('No such server'));
  } finally {
    await browser.close();
  }
  // A form posted without the session's token (another site's form) calls nothing: it ends
  // at the sign-in.
  const r = await fetch(`${base}/servers/${nsA}/weather/tools/greet`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: 'name=x',
  });
  assert.ok(r.url.endsWith('/login') || r.url.includes('/realms/'), r.url);
});
