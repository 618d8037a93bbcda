/**
 * What the client refuses before sending anything, proved against a real listener that
 * counts connections (none must arrive), and what it says when no daemon is there.
 * @module
 */

import assert from "node:assert/strict";
import { createServer as createHttpServer } from "node:http";
import { type Server, createServer } from "node:net";
import { after, before, test } from "node:test";
import { inspect } from "node:util";

import { Client, NotDispatchedError, type RunOptions, notDispatchedReason } from "@plimsoll/client";

let listener: Server;
let connections = 0;
let url = "";

before(async () => {
  listener = createServer((s) => {
    connections++;
    s.destroy();
  });
  await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
  const addr = listener.address();
  assert.ok(addr !== null && typeof addr !== "string");
  url = `http://127.0.0.1:${addr.port}`;
});

after(async () => {
  await new Promise<void>((resolve) => listener.close(() => resolve()));
});

const snippet = (code: string): RunOptions["run"] => ({ kind: "snippet", language: "javascript", code });
const project = (p: Record<string, unknown>): RunOptions["run"] => ({ kind: "project", steps: [{ run: "true" }], ...p }) as RunOptions["run"];

const invalid: [string, RunOptions, RegExp][] = [
  ["blank code", { run: snippet(" \n\t\u3000") }, /run\.code is empty/],
  ["lone surrogate", { run: snippet("console.log('\ud800')") }, /lone surrogate/],
  ["unknown language", { run: { kind: "snippet", language: "js", code: "1" } as unknown as RunOptions["run"] }, /run\.language/],
  ["unknown kind", { run: { kind: "shell" } as unknown as RunOptions["run"] }, /run\.kind/],
  ["misspelt member", { run: project({ artefacts: ["a"] }) }, /unknown member `artefacts`/],
  ["no steps", { run: project({ steps: [] }) }, /at least one step/],
  ["blank step", { run: project({ steps: [{ run: "  " }] }) }, /run\.steps\[0\]\.run is empty/],
  ["absolute path", { run: project({ files: [{ path: "/etc/passwd", content: "x" }] }) }, /must be relative/],
  ["dot-dot path", { run: project({ artifacts: ["a/../../b"] }) }, /must be relative/],
  ["empty segment", { run: project({ artifacts: ["a//b"] }) }, /must be relative/],
  ["backslash", { run: project({ files: [{ path: "a\\b", content: "x" }] }) }, /backslash/],
  ["path twice", { run: project({ files: [{ path: "a", content: "x" }, { path: "a", content: "y" }] }) }, /appears twice/],
  ["content not bytes", { run: project({ files: [{ path: "a", content: 12 }] }) }, /string or a Uint8Array/],
  ["limit of 0", { run: snippet("1"), limits: { timeout_ms: 0 } }, /limits\.timeout_ms must be a whole number greater than 0/],
  ["fractional limit", { run: snippet("1"), limits: { memory_bytes: 1.5 } }, /limits\.memory_bytes/],
  ["unknown limit", { run: snippet("1"), limits: { cpus: 2 } as unknown as RunOptions["limits"] }, /unknown member `cpus`/],
  ["unknown tier", { run: snippet("1"), minimum_isolation: "hardware" as unknown as RunOptions["minimum_isolation"] }, /minimum_isolation/],
  ["empty provider", { run: snippet("1"), provider: "" }, /provider must not be empty/],
  ["empty grant", { run: snippet("1"), grant: "" }, /grant must not be empty/],
];

for (const [name, options, message] of invalid) {
  test(`an invalid request is refused here and never sent: ${name}`, async () => {
    const before = connections;
    const e = await new Client({ url, token: "t" }).run(options).then(
      (v) => assert.fail(`sent: ${inspect(v)}`),
      (x: unknown) => x,
    );
    assert.ok(e instanceof NotDispatchedError, inspect(e));
    assert.equal(e.reason, "request");
    assert.equal(e.source, "client");
    assert.equal(notDispatchedReason(e), "request");
    assert.match(e.message, message);
    assert.match(e.message, /nothing was sent/);
    assert.match(e.requestId ?? "", /^[0-9a-f]{32}$/);
    assert.equal(connections, before, "the client connected");
  });
}

test("a daemon that is not there is not dispatched (environment), and not ready", async () => {
  // A port that was just free: nothing listens, so the connect is refused.
  const free = createServer();
  await new Promise<void>((resolve) => free.listen(0, "127.0.0.1", resolve));
  const addr = free.address();
  assert.ok(addr !== null && typeof addr !== "string");
  await new Promise<void>((resolve) => free.close(() => resolve()));
  const c = new Client({ url: `http://127.0.0.1:${addr.port}`, token: "t" });
  const e = await c.runJavaScript("console.log(1)", { minimum_isolation: "process" }).catch((x: unknown) => x);
  assert.ok(e instanceof NotDispatchedError, inspect(e));
  assert.equal(e.reason, "environment");
  assert.equal(e.source, "unreachable");
  assert.match(e.message, /check that plimsolld is running/);
  assert.equal(await c.isReady(), false);
  // Without a floor the client first asks for the default floor: it cannot, so sends nothing.
  const d = await c.runJavaScript("console.log(1)").catch((x: unknown) => x);
  assert.equal(notDispatchedReason(d), "environment", inspect(d));
});

test("a client needs a URL it can use and a token", () => {
  assert.throws(() => new Client({ url: "127.0.0.1:7878", token: "t" }), /not a URL/);
  assert.throws(() => new Client({ url: "ftp://127.0.0.1", token: "t" }), /http or https/);
  assert.throws(() => new Client({ url: "http://127.0.0.1", token: "" }), /token/);
  assert.throws(() => new Client({ url: "http://127.0.0.1", token: "t", maxBodyBytes: 0 }), /maxBodyBytes/);
  assert.equal(new Client({ url: "http://127.0.0.1:7878///", token: "t" }).url, "http://127.0.0.1:7878");
});

test("a session open sends the grant it names, and an empty one is refused here, unsent", async () => {
  // A listener that reads the open and refuses it as a daemon refuses a grant it will not
  // give, echoing the request id (so the refusal is believed: nothing opened).
  const seen: { method?: string; url?: string; body: Record<string, unknown> }[] = [];
  const server = createHttpServer((req, res) => {
    const parts: Buffer[] = [];
    req.on("data", (b: Buffer) => parts.push(b));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(parts).toString("utf8")) as Record<string, unknown>;
      seen.push({ method: req.method, url: req.url, body });
      res.writeHead(403, { "content-type": "application/json", connection: "close" });
      res.end(
        JSON.stringify({
          protocol: 1,
          request_id: body.request_id,
          error: { code: "permission", message: "grant not allowed: this caller may not use that grant profile", not_dispatched: "permission" },
        }),
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const addr = server.address();
    assert.ok(addr !== null && typeof addr !== "string");
    const c = new Client({ url: `http://127.0.0.1:${addr.port}`, token: "t" });
    const e = await c.openSession({ language: "python", minimum_isolation: "container", grant: "pkgs" }).catch((x: unknown) => x);
    assert.ok(e instanceof NotDispatchedError, inspect(e));
    assert.equal(e.reason, "permission");
    assert.equal(seen.length, 1);
    assert.equal(seen[0]!.method, "POST");
    assert.equal(seen[0]!.url, "/v1/sessions");
    assert.equal(seen[0]!.body.grant, "pkgs");
    assert.equal(seen[0]!.body.language, "python");
    const empty = await c.openSession({ language: "python", minimum_isolation: "container", grant: "" }).catch((x: unknown) => x);
    assert.ok(empty instanceof NotDispatchedError, inspect(empty));
    assert.equal(empty.source, "client");
    assert.match(empty.message, /grant must not be empty/);
    assert.equal(seen.length, 1, "the empty grant was sent");
  } finally {
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
