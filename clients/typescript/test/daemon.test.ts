/**
 * The client against a real plimsolld (process and crun providers) over real HTTP, and
 * against real proxies on loopback that swap, alter or downgrade what passes through them.
 * Under CI=true a missing daemon binary, image or runtime fails these tests instead of
 * skipping them.
 * @module
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { type Server, createServer as createHttpServer } from "node:http";
import { createServer as createTcpServer } from "node:net";
import { after, before, test, type TestContext } from "node:test";
import { resolve } from "node:path";
import { inspect, isDeepStrictEqual } from "node:util";

import {
  Client,
  DigestMismatchError,
  EvidenceMismatchError,
  MayHaveRunError,
  NotDispatchedError,
  ProviderMismatchError,
  RecordMismatchError,
  RequestTooLargeError,
  decodeRunRecord,
  notDispatchedReason,
  recordSha256,
  text,
} from "@plimsoll/client";

import { runCodeTool } from "../examples/agent-tool.js";
import { CALLER, LocalDaemon, missingForDaemon, missingForImage } from "./daemon.js";
import { CLIENT_DIR, REPO, strict } from "./paths.js";
import { Proxy, type Rewrite } from "./proxy.js";

/** The secret of the test grant: it must never reach a result. */
const API_SECRET = `api-secret-${process.pid}-do-not-leak`;
/** The daemon's `max_body_bytes` (smaller than the client's default, for the 413 test). */
const DAEMON_MAX_BODY = 64 * 1024;

let daemon: LocalDaemon | undefined;
let api: Server | undefined;
let apiCalls: { path: string; authorization: string | undefined }[] = [];
let setupProblem: string | undefined;
let containerProblem: string | undefined;

/** Says whether the test may go on; prints `SKIP` (or fails under CI=true) otherwise. */
function ready(t: TestContext, needs: "daemon" | "container" = "daemon"): boolean {
  const why = setupProblem ?? (needs === "container" ? containerProblem : undefined);
  if (why === undefined) return true;
  if (strict()) assert.fail(`SKIP not allowed under CI=true: ${t.name}: ${why}`);
  console.error(`SKIP ${t.name}: ${why}`);
  t.skip(why);
  return false;
}

function client(url = daemon!.url, options: { maxBodyBytes?: number } = {}): Client {
  return new Client({ url, token: daemon!.token, ...options });
}

/** The error a promise rejects with (fails the test when it resolves). */
async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    const v = await p;
    assert.fail(`expected an error, got ${inspect(v, { depth: 1 })}`);
  } catch (e) {
    if (e instanceof assert.AssertionError) throw e;
    return e;
  }
}

/** A loopback API for the grant, answering `GET /orders/N` only with the right credential. */
async function startApi(): Promise<number> {
  api = createHttpServer((req, res) => {
    apiCalls.push({ path: req.url ?? "", authorization: req.headers.authorization });
    const ok = req.headers.authorization === `Bearer ${API_SECRET}` && /^\/orders\/\d+$/.test(req.url ?? "");
    res.writeHead(ok ? 200 : 403, { "content-type": "application/json", connection: "close" });
    res.end(JSON.stringify(ok ? { id: Number(req.url!.split("/")[2]), item: "tea" } : { error: "no" }));
  });
  await new Promise<void>((resolve) => api!.listen(0, "127.0.0.1", resolve));
  const addr = api.address();
  if (addr === null || typeof addr === "string") throw new Error("api: no port");
  return addr.port;
}

before(async () => {
  setupProblem = missingForDaemon();
  if (setupProblem !== undefined) return;
  containerProblem = missingForImage();
  const apiPort = await startApi();
  daemon = await LocalDaemon.start({
    providers: ["process", "crun"],
    maxBodyBytes: DAEMON_MAX_BODY,
    grants: [
      "[profiles.orders]",
      `base_url = "http://127.0.0.1:${apiPort}"`,
      `routes = ["GET /orders/*"]`,
      `callers = ["${CALLER}"]`,
      "call_budget = 3",
      "",
      "[profiles.orders.credential]",
      `kind = "static"`,
      `secret_env = "ORDERS_TEST_TOKEN"`,
      "",
      "[profiles.others]",
      `base_url = "http://127.0.0.1:${apiPort}"`,
      `routes = ["GET /orders/*"]`,
      `callers = ["someone-else"]`,
      "call_budget = 1",
      "",
      "[profiles.others.credential]",
      `kind = "static"`,
      `secret_env = "ORDERS_TEST_TOKEN"`,
      "",
      // An egress grant listing one host: a cell that asks for another is refused by the
      // broker before anything is resolved or connected (no network needed).
      "[egress.pkgs]",
      `callers = ["${CALLER}"]`,
      `hosts = ["pypi.plimsoll.test"]`,
      "ports = [80]",
      "",
    ].join("\n"),
    env: { ORDERS_TEST_TOKEN: API_SECRET },
  });
  if (containerProblem === undefined) {
    const crun = (await client().providers()).providers.find((p) => p.name === "crun");
    if (crun === undefined || !crun.available) {
      containerProblem = `crun is not available here: ${crun?.unavailable_reason ?? "not listed"}`;
    }
  }
});

after(async () => {
  await daemon?.stop();
  await new Promise<void>((resolve) => (api === undefined ? resolve() : api.close(() => resolve())));
});

// ---------------------------------------------------------------------------------------
// Runs at each tier the host has.

test("a JavaScript run at the process tier verifies, with a fresh request id each time", async (t) => {
  if (!ready(t)) return;
  const c = client();
  const x = await c.exchange({ run: { kind: "snippet", language: "javascript", code: "console.log(6 * 7)" }, minimum_isolation: "process" });
  const res = x.response;
  assert.deepEqual(res.result.stdout, new TextEncoder().encode("42\n"));
  assert.equal(text(res.result.stdout), "42\n");
  assert.equal(res.result.exit_code, 0);
  assert.equal(res.isolation, "process");
  assert.equal(res.provider, "process");
  assert.match(res.request_id, /^[0-9a-f]{32}$/);
  assert.equal(x.request.request_id, res.request_id);
  assert.deepEqual(x.floor, { tier: "process", source: "request" });
  assert.equal(res.record.minimum_isolation, "process");
  assert.match(res.record.record_sha256, /^[0-9a-f]{64}$/);

  const again = await c.runJavaScript("console.log(6 * 7)", { minimum_isolation: "process" });
  assert.notEqual(again.request_id, res.request_id);
  // The id is not part of the request digest. A result also says how its sandbox started
  // (warm or cold, a member's age) and its wall (its uid), all inside the digest: the
  // digests agree exactly when the results do.
  assert.equal(again.request_sha256, res.request_sha256);
  assert.deepEqual(again.result.stdout, res.result.stdout);
  assert.equal(again.result_sha256 === res.result_sha256, isDeepStrictEqual(again.result, res.result));
});

test("a Python run keeps non-UTF-8 output as exact bytes and reports its exit code", async (t) => {
  if (!ready(t)) return;
  const res = await client().runPython(
    "import sys\nsys.stdout.buffer.write(bytes([0xef, 0xbb, 0xbf, 0xff, 0x00, 0x0a]))\nsys.stderr.write('oops')\nsys.exit(3)",
    { minimum_isolation: "process" },
  );
  assert.deepEqual([...res.result.stdout], [0xef, 0xbb, 0xbf, 0xff, 0x00, 0x0a]);
  assert.equal(text(res.result.stderr), "oops");
  assert.equal(res.result.exit_code, 3);
  assert.equal(res.isolation, "process");
});

test("a breached limit is a result: a timeout, a truncated stream", async (t) => {
  if (!ready(t)) return;
  const c = client();
  const slow = await c.runJavaScript("for (;;) {}", { minimum_isolation: "process", limits: { timeout_ms: 500 } });
  assert.equal(slow.result.timed_out, true);
  const loud = await c.runJavaScript("process.stdout.write('x'.repeat(5000))", {
    minimum_isolation: "process",
    limits: { output_bytes: 100 },
  });
  assert.equal(loud.result.stdout_truncated, true);
  assert.equal(loud.result.stdout.byteLength, 100);
});

test("a run at the container tier (crun) verifies", async (t) => {
  if (!ready(t, "container")) return;
  const res = await client().runJavaScript("console.log(process.version.startsWith('v'))", {
    minimum_isolation: "container",
    provider: "crun",
  });
  assert.equal(res.isolation, "container");
  assert.equal(res.provider, "crun");
  assert.equal(text(res.result.stdout), "true\n");
});

test("a run without a floor is checked against the daemon's default floor", async (t) => {
  if (!ready(t, "container")) return;
  const c = client();
  const x = await c.exchange({ run: { kind: "snippet", language: "python", code: "print('hi')" } });
  assert.equal(x.request.minimum_isolation, undefined);
  assert.deepEqual(x.floor, { tier: "container", source: "daemon_default" });
  assert.equal(x.response.isolation, "container");
  // The record states the floor the daemon applied: its default, the one the client learnt.
  assert.equal(x.response.record.minimum_isolation, "container");
  assert.equal(await c.defaultFloor(), "container");
});

test("a project's files, steps and artifacts round-trip as exact bytes", async (t) => {
  if (!ready(t, "container")) return;
  const data = Uint8Array.from([0x00, 0x01, 0xff, 0xfe, 0x80, 0xc3, 0x28, 0x0a, 0xef, 0xbb, 0xbf]);
  const res = await client().runProject(
    {
      files: [
        { path: "in/data.bin", content: data },
        { path: "bom.txt", content: Uint8Array.from([0xef, 0xbb, 0xbf, 0x68, 0x69]) },
        { path: "run.sh", content: "#!/bin/sh\ncat in/data.bin in/data.bin > out.bin\necho done\n", executable: true },
      ],
      steps: [
        { name: "double", run: "./run.sh" },
        { run: "printf '\\377\\000ok'; cat bom.txt >&2" },
      ],
      artifacts: ["out.bin", "bom.txt", "missing.txt"],
    },
    { minimum_isolation: "container" },
  );
  assert.equal(res.isolation, "container");
  assert.equal(res.result.exit_code, 0);
  assert.equal(res.result.steps.length, 2);
  assert.equal(res.result.steps[0]!.name, "double");
  assert.equal(text(res.result.steps[0]!.stdout), "done\n");
  assert.deepEqual([...res.result.steps[1]!.stdout], [0xff, 0x00, 0x6f, 0x6b]);
  assert.deepEqual([...res.result.steps[1]!.stderr], [0xef, 0xbb, 0xbf, 0x68, 0x69]);
  const [out, bom, missing] = res.result.artifacts;
  assert.deepEqual(out, { path: "out.bin", found: true, size: 22, content: Uint8Array.from([...data, ...data]), truncated: false });
  assert.deepEqual([...bom!.content], [0xef, 0xbb, 0xbf, 0x68, 0x69]);
  assert.equal(text(bom!.content), "\ufeffhi");
  assert.deepEqual(missing, { path: "missing.txt", found: false, size: 0, content: new Uint8Array(0), truncated: false });
});

test("providers lists process and crun, each evidence digest checked", async (t) => {
  if (!ready(t)) return;
  const p = await client().providers();
  assert.equal(p.protocol, 1);
  assert.equal(p.default_floor, "container");
  const process = p.providers.find((x) => x.name === "process");
  assert.ok(process !== undefined && process.available, inspect(process));
  assert.equal(process.isolation, "process");
  assert.match(process.evidence_sha256, /^[0-9a-f]{64}$/);
  const crun = p.providers.find((x) => x.name === "crun");
  assert.ok(crun !== undefined);
  assert.equal(crun.isolation, "container");
  assert.ok(await client().isReady());
});

// ---------------------------------------------------------------------------------------
// Trials (docs/simulators.md): the default image's tank, at crun.

/** The SHA-256 of the accepted tank controller's trajectory on hidden-1, on every host and tier. */
const ACCEPTED_FINGERPRINT = "f0fe0f868cdd7b2fd62fee9132f4ec5f62ec04980aac34d0ec552f134d1e0e47";
const HIDDEN_1 = { path: "hidden-1.json", content: readFileSync(resolve(REPO, "sims/tank/scenarios/hidden-1.json")) };
/** Generous deadlines: the tests share two cores with everything else. */
const DEADLINES = { first_deadline_ms: 20_000, tick_deadline_ms: 5_000 };

function tankController(name: string): { path: string; content: Uint8Array } {
  return { path: name, content: readFileSync(resolve(REPO, "examples/controllers/tank", name)) };
}

test("the default image lists its simulators: cartpole, tank and motor", async (t) => {
  if (!ready(t, "container")) return;
  const image = (await client().providers()).images.find((i) => i.default);
  assert.ok(image !== undefined);
  assert.deepEqual(
    image.simulators.map((s) => s.name),
    ["cartpole", "tank", "motor"],
  );
  for (const s of image.simulators) {
    assert.equal(s.path, `/opt/plimsoll/simulators/${s.name}.wasm`);
    assert.match(s.sha256, /^[0-9a-f]{64}$/);
  }
});

test("the accepted tank controller passes: its fingerprint is its trajectory's SHA-256", async (t) => {
  if (!ready(t, "container")) return;
  const c = client();
  const res = await c.trial({
    simulator: "tank",
    controller: tankController("accepted.py"),
    scenarios: [HIDDEN_1],
    reproducible: true,
    minimum_isolation: "container",
    ...DEADLINES,
  });
  assert.equal(res.result.exit_code, 0, inspect(res.result.steps, { depth: 3 }));
  assert.equal(res.record.trials.length, 1);
  const step = res.record.trials[0]!;
  assert.equal(step.step, 0);
  assert.equal(step.pass, true);
  assert.equal(step.simulator.name, "tank");
  // The simulator the record names is the module the image it ran in declares.
  const image = (await c.providers()).images.find((i) => i.identity === res.record.image?.identity);
  assert.ok(image !== undefined, inspect(res.record.image));
  assert.equal(step.simulator.sha256, image.simulators.find((s) => s.name === "tank")?.sha256);
  assert.equal(step.trials.length, 1);
  const trial = step.trials[0]!;
  assert.deepEqual([trial.scenario, trial.end, trial.pass, trial.ticks], ["hidden-1", "completed", true, 1800]);
  assert.ok(trial.score !== undefined && trial.score >= 0.75, inspect(trial));
  const [trajectory] = res.result.artifacts;
  assert.ok(trajectory !== undefined && trajectory.found && !trajectory.truncated);
  assert.equal(trajectory.path, "hidden-1.bin");
  assert.equal(createHash("sha256").update(trajectory.content).digest("hex"), trial.fingerprint);
  assert.equal(trial.fingerprint, ACCEPTED_FINGERPRINT);
});

test("the failing tank controllers overflow; the JavaScript one's accepted twin has the same fingerprint", async (t) => {
  if (!ready(t, "container")) return;
  const c = client();
  const [failing, failingJs, acceptedJs] = await Promise.all([
    c.trial({ simulator: "tank", controller: tankController("failing.py"), scenarios: [HIDDEN_1], ...DEADLINES }),
    c.trial({ simulator: "tank", controller: tankController("failing.js"), scenarios: [HIDDEN_1], ...DEADLINES }),
    c.trial({ simulator: "tank", controller: tankController("accepted.js"), scenarios: [HIDDEN_1], ...DEADLINES }),
  ]);
  for (const res of [failing, failingJs]) {
    // A failed exam is a result: the runner exits 1 and the record says why.
    assert.equal(res.result.exit_code, 1, inspect(res.result.steps, { depth: 3 }));
    const step = res.record.trials[0]!;
    assert.equal(step.pass, false);
    const trial = step.trials[0]!;
    assert.deepEqual([trial.end, trial.pass], ["failed", false]);
    assert.match(trial.reason ?? "", /overflowed/);
    assert.equal(createHash("sha256").update(res.result.artifacts[0]!.content).digest("hex"), trial.fingerprint);
  }
  assert.equal(acceptedJs.record.trials[0]?.pass, true);
  assert.equal(acceptedJs.record.trials[0]?.trials[0]?.fingerprint, ACCEPTED_FINGERPRINT);
});

test("a simulator the image lacks is refused with nothing run (environment)", async (t) => {
  if (!ready(t, "container")) return;
  const e = await rejection(
    client().trial({ simulator: "boat", controller: tankController("accepted.py"), scenarios: [HIDDEN_1], minimum_isolation: "container" }),
  );
  assert.ok(e instanceof NotDispatchedError, inspect(e));
  assert.equal(e.reason, "environment");
  assert.equal(e.source, "daemon");
  assert.equal(notDispatchedReason(e), "environment");
  assert.match(e.message, /boat/);
});

// ---------------------------------------------------------------------------------------
// Refusals: nothing ran.

test("a floor no provider meets is refused with nothing run (isolation)", async (t) => {
  if (!ready(t)) return;
  const e = await rejection(client().runJavaScript("console.log(1)", { minimum_isolation: "vm" }));
  assert.ok(e instanceof NotDispatchedError, inspect(e));
  assert.equal(e.reason, "isolation");
  assert.equal(e.source, "daemon");
  assert.equal(e.status, 422);
  assert.equal(notDispatchedReason(e), "isolation");
  assert.match(e.message, /^not dispatched \(isolation\): /);
});

test("a bad token is refused (permission) and no token is ever printed", async (t) => {
  if (!ready(t)) return;
  const secret = "plm_not-a-valid-token-but-still-secret";
  const bad = new Client({ url: daemon!.url, token: secret });
  const e = await rejection(bad.runJavaScript("console.log(1)", { minimum_isolation: "process" }));
  assert.equal(notDispatchedReason(e), "permission", inspect(e));
  const good = client();
  for (const s of [
    String(e),
    inspect(e, { depth: 10 }),
    JSON.stringify(e),
    inspect(bad),
    String(bad),
    JSON.stringify(bad),
    inspect(good),
    JSON.stringify({ good }),
  ]) {
    assert.ok(!s.includes(secret), s);
    assert.ok(!s.includes(daemon!.token), s);
  }
});

test("a grant the caller may not use is refused (permission)", async (t) => {
  if (!ready(t)) return;
  const e = await rejection(client().runJavaScript("console.log(1)", { minimum_isolation: "process", grant: "others" }));
  assert.equal(notDispatchedReason(e), "permission", inspect(e));
});

test("a body over the daemon's limit reads not dispatched: its 413 echoes our id", async (t) => {
  if (!ready(t)) return;
  // The client's limit (8 MiB) is above the daemon's: the daemon refuses it, echoing the id
  // it finds before `run` in the body's first bytes.
  const e = await rejection(client().runJavaScript(`console.log('${"x".repeat(DAEMON_MAX_BODY)}')`, { minimum_isolation: "process" }));
  assert.ok(e instanceof NotDispatchedError, inspect(e));
  assert.equal(e.source, "daemon");
  assert.equal(e.status, 413);
  assert.equal(notDispatchedReason(e), "request");
});

test("a body over the client's limit is refused before anything is sent", async () => {
  // A real listener that nothing should connect to.
  const listener = createTcpServer();
  let connections = 0;
  listener.on("connection", (s) => {
    connections++;
    s.destroy();
  });
  await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
  const addr = listener.address();
  assert.ok(addr !== null && typeof addr !== "string");
  const url = `http://127.0.0.1:${addr.port}`;
  try {
    const c = new Client({ url, token: "t" });
    assert.equal(c.maxBodyBytes, 8 * 1024 * 1024);
    const big = await rejection(c.runJavaScript(`console.log('${"x".repeat(9 * 1024 * 1024)}')`, { minimum_isolation: "process" }));
    assert.ok(big instanceof RequestTooLargeError, inspect(big));
    assert.equal(big.limit, 8 * 1024 * 1024);
    assert.ok(big.size > 9 * 1024 * 1024);
    assert.equal(notDispatchedReason(big), "request");
    assert.match(big.message, /limit/);
    const small = new Client({ url, token: "t", maxBodyBytes: 4096 });
    const e = await rejection(small.runJavaScript(`console.log('${"x".repeat(5000)}')`, { minimum_isolation: "process" }));
    assert.ok(e instanceof RequestTooLargeError, inspect(e));
    assert.equal(connections, 0, "the client connected although the request was over its limit");
  } finally {
    await new Promise<void>((resolve) => listener.close(() => resolve()));
  }
});

// ---------------------------------------------------------------------------------------
// Grants: a real API behind the broker.

test("a run with a grant calls the API through the broker, the credential never in the result", async (t) => {
  if (!ready(t)) return;
  apiCalls = [];
  const x = await client().exchange({
    run: {
      kind: "snippet",
      language: "javascript",
      code: [
        "host.get('/orders/42')",
        "  .then((o) => console.log(JSON.stringify(o)))",
        "  .then(() => host.get('/admin'))",
        "  .catch((e) => console.log('refused', e.code));",
      ].join("\n"),
    },
    minimum_isolation: "process",
    grant: "orders",
  });
  const res = x.response;
  assert.equal(text(res.result.stdout), '{"id":42,"item":"tea"}\nrefused route_not_allowed\n');
  assert.equal(res.result.calls.length, 2);
  const [ok, refused] = res.result.calls;
  assert.equal(ok!.method, "GET");
  assert.equal(ok!.route, "/orders/*");
  assert.equal(ok!.status, 200);
  assert.equal(ok!.error, undefined);
  assert.equal(refused!.error, "route_not_allowed");
  assert.equal(refused!.status, undefined);
  assert.deepEqual(apiCalls, [{ path: "/orders/42", authorization: `Bearer ${API_SECRET}` }]);
  assert.ok(!Buffer.from(x.responseBody).includes(API_SECRET), "the credential reached the answer");
});

test("a session holds its grant for its whole life: each call lists the calls and receipts since the call before", async (t) => {
  if (!ready(t, "container")) return;
  apiCalls = [];
  const c = client();
  const api = await c.openSession({ language: "javascript", minimum_isolation: "container", provider: "crun", grant: "orders" });
  try {
    const first = await api.cell("host.get('/orders/7').then((o) => console.log(o.item))");
    assert.equal(text(first.result.stdout), "tea\n", text(first.result.stderr));
    assert.deepEqual(
      first.result.calls.map((x) => [x.method, x.route, x.status, x.error]),
      [["GET", "/orders/*", 200, undefined]],
    );
    const second = await api.cell("host.get('/orders/8').then((o) => console.log(o.id))");
    assert.equal(text(second.result.stdout), "8\n", text(second.result.stderr));
    assert.deepEqual(
      second.result.calls.map((x) => x.route),
      ["/orders/*"],
    );
    assert.deepEqual((await api.cell("console.log(1)")).result.calls, []);
    assert.deepEqual(apiCalls, [
      { path: "/orders/7", authorization: `Bearer ${API_SECRET}` },
      { path: "/orders/8", authorization: `Bearer ${API_SECRET}` },
    ]);
  } finally {
    await api.close().catch(() => undefined);
  }

  const egress = await c.openSession({ language: "python", minimum_isolation: "container", provider: "crun", grant: "pkgs" });
  try {
    // Plain HTTP through HTTP_PROXY, which the session's interpreter has.
    const r = await egress.cell(
      [
        "import urllib.request",
        "try:",
        "    urllib.request.urlopen('http://elsewhere.plimsoll.test/simple/', timeout=20)",
        "except Exception as e:",
        "    print('refused', getattr(e, 'code', e))",
      ].join("\n"),
    );
    assert.equal(text(r.result.stdout), "refused 403\n", text(r.result.stderr));
    assert.equal(r.result.egress.length, 1);
    const [receipt] = r.result.egress;
    assert.deepEqual(
      [receipt!.host, receipt!.port, receipt!.kind, receipt!.verdict, receipt!.rule, receipt!.address, receipt!.sni, receipt!.ended],
      ["elsewhere.plimsoll.test", 80, "http", "refused", "host_not_allowed", undefined, undefined, undefined],
    );
    assert.deepEqual([receipt!.bytes_up, receipt!.bytes_down], [0, 0]);
    assert.deepEqual((await egress.cell("print(1)")).result.egress, []);
  } finally {
    await egress.close().catch(() => undefined);
  }

  // A grant this caller may not use opens nothing, as one that does not exist.
  for (const grant of ["others", "no-such-grant"]) {
    const e = await rejection(c.openSession({ language: "python", minimum_isolation: "container", grant }));
    assert.ok(e instanceof NotDispatchedError, inspect(e));
    assert.equal(e.reason, "permission");
  }
  assert.deepEqual((await c.listSessions()).sessions, []);
});

// ---------------------------------------------------------------------------------------
// Parties in the middle.

function rewriting(request?: Rewrite, response?: Rewrite): Promise<Proxy> {
  return Proxy.start(daemon!.url, { kind: "rewrite", request, response });
}

test("a proxy that swaps two answers cannot make a run read 'nothing ran'", async (t) => {
  if (!ready(t)) return;
  const proxy = await Proxy.start(daemon!.url, { kind: "swap" });
  try {
    const c = client(proxy.url);
    // One request is refused (floor vm: nothing offers it), the other runs.
    const [refused, ran] = await Promise.allSettled([
      c.runJavaScript("console.log('refused')", { minimum_isolation: "vm" }),
      c.runJavaScript("console.log('ran')", { minimum_isolation: "process" }),
    ]);
    assert.equal(proxy.received, 2);
    // The run that ran got the other's refusal: it must not read "nothing ran".
    assert.equal(ran.status, "rejected");
    const r = ran.reason as unknown;
    assert.ok(r instanceof MayHaveRunError, inspect(r));
    assert.equal(r.kind, "unverified_refusal");
    // The code is the check that failed here, as in every client, never the forger's word.
    assert.equal(r.code, "unverified_refusal");
    assert.equal(r.claimedReason, "isolation");
    assert.equal(r.claimedCode, "isolation");
    assert.equal(notDispatchedReason(r), undefined);
    assert.match(r.message, /may have run/);
    // The refused one got the other's result: it must not take it as its own.
    assert.equal(refused.status, "rejected");
    const s = refused.reason as unknown;
    assert.ok(s instanceof MayHaveRunError, inspect(s));
    assert.equal(s.kind, "request_id_mismatch");
    assert.equal(notDispatchedReason(s), undefined);
  } finally {
    await proxy.close();
  }
});

test("a proxy that changes one byte of a result is a result digest mismatch", async (t) => {
  if (!ready(t)) return;
  const proxy = await rewriting(undefined, (v) => {
    assert.equal(v.result.stdout, "42\n");
    v.result.stdout = "43\n";
  });
  try {
    const e = await rejection(client(proxy.url).runJavaScript("console.log(6 * 7)", { minimum_isolation: "process" }));
    assert.ok(e instanceof DigestMismatchError, inspect(e));
    assert.equal(e.digest, "result");
    assert.notEqual(e.computed, e.claimed);
    assert.ok(e.message.includes(e.computed) && e.message.includes(e.claimed));
    assert.equal(notDispatchedReason(e), undefined);
  } finally {
    await proxy.close();
  }
});

test("a proxy that rewrites the request on the way in is a request digest mismatch", async (t) => {
  if (!ready(t)) return;
  const proxy = await rewriting((v) => {
    v.run.code = "console.log(7 * 6)";
  });
  try {
    const e = await rejection(client(proxy.url).runJavaScript("console.log(6 * 7)", { minimum_isolation: "process" }));
    assert.ok(e instanceof DigestMismatchError, inspect(e));
    assert.equal(e.digest, "request");
  } finally {
    await proxy.close();
  }
});

test("a proxy that lowers the floor on the way in is an evidence mismatch", async (t) => {
  if (!ready(t)) return;
  const proxy = await rewriting((v) => {
    assert.equal(v.minimum_isolation, "kernel");
    v.minimum_isolation = "process";
  });
  try {
    const e = await rejection(client(proxy.url).runJavaScript("console.log(1)", { minimum_isolation: "kernel" }));
    assert.ok(e instanceof EvidenceMismatchError, inspect(e));
    assert.equal(e.isolation, "process");
    assert.equal(e.floor, "kernel");
    assert.equal(e.floorSource, "request");
    // The code ran: this is not a refusal.
    assert.equal(notDispatchedReason(e), undefined);
    assert.match(e.message, /the code ran/);
  } finally {
    await proxy.close();
  }
});

/** Claims the run used the process tier, recomputing the record's digest when asked. */
function downgrade(recompute: boolean): Rewrite {
  return (v) => {
    assert.equal(v.isolation, "container");
    v.isolation = "process";
    v.record.isolation = "process";
    if (recompute) v.record.record_sha256 = recordSha256(decodeRunRecord(JSON.stringify(v.record)));
  };
}

test("an answer claiming a tier below the floor is an evidence mismatch, digests stale or recomputed", async (t) => {
  if (!ready(t, "container")) return;
  for (const recompute of [false, true]) {
    const proxy = await rewriting(undefined, downgrade(recompute));
    try {
      const c = client(proxy.url);
      const e = await rejection(c.runJavaScript("console.log(1)", { minimum_isolation: "container" }));
      assert.ok(e instanceof EvidenceMismatchError, `recompute ${recompute}: ${inspect(e)}`);
      assert.equal(e.isolation, "process");
      assert.equal(e.floor, "container");
      assert.equal(notDispatchedReason(e), undefined);
      // Sent with no floor, the daemon's default floor (container) is what it is checked against.
      const d = await rejection(c.runJavaScript("console.log(1)"));
      assert.ok(d instanceof EvidenceMismatchError, inspect(d));
      assert.equal(d.floorSource, "daemon_default");
      assert.equal(d.floor, "container");
      if (recompute) {
        // Every digest of the rewritten answer holds: with a floor it meets, it verifies.
        const ok = await c.runJavaScript("console.log(1)", { minimum_isolation: "process", provider: "crun" });
        assert.equal(ok.isolation, "process");
        assert.equal(ok.record.provider, "crun");
      }
    } finally {
      await proxy.close();
    }
  }
});

/** Recomputes the record's digest after a rewrite, as a party in the middle would. */
function resign(v: { record: { record_sha256: string } }): void {
  v.record.record_sha256 = recordSha256(decodeRunRecord(JSON.stringify(v.record)));
}

test("a record without its applied floor is refused, the record digest recomputed or not", async (t) => {
  if (!ready(t)) return;
  // Left out of the record digest when absent, so with it recomputed the record is one an
  // older daemon could have written: only the applied-floor check catches it.
  const drops: Rewrite[] = [
    (v) => {
      assert.equal(v.record.minimum_isolation, "process");
      delete v.record.minimum_isolation;
      resign(v);
    },
    (v) => {
      v.record.minimum_isolation = null;
      resign(v);
    },
  ];
  for (const drop of drops) {
    const proxy = await rewriting(undefined, drop);
    try {
      const e = await rejection(client(proxy.url).runJavaScript("console.log(1)", { minimum_isolation: "process" }));
      assert.ok(e instanceof MayHaveRunError && e.kind === "bad_response", inspect(e));
      assert.match(e.message, /states no applied floor \(`record.minimum_isolation`\)/);
      assert.equal(notDispatchedReason(e), undefined);
    } finally {
      await proxy.close();
    }
  }
});

test("an applied floor lowered to process on a container run, its digest recomputed, is a record mismatch", async (t) => {
  if (!ready(t, "container")) return;
  const proxy = await rewriting(undefined, (v) => {
    assert.equal(v.isolation, "container");
    assert.equal(v.record.minimum_isolation, "container");
    v.record.minimum_isolation = "process";
    resign(v);
  });
  try {
    const c = client(proxy.url);
    const e = await rejection(c.runJavaScript("console.log(1)", { minimum_isolation: "container" }));
    assert.ok(e instanceof RecordMismatchError, inspect(e));
    assert.deepEqual([e.field, e.response, e.record], ["minimum_isolation", "container", "process"]);
    assert.match(e.message, /the floor sent/);
    assert.equal(notDispatchedReason(e), undefined);
    // None sent: the record's floor must be the daemon's default floor (container).
    const d = await rejection(c.runJavaScript("console.log(1)"));
    assert.ok(d instanceof RecordMismatchError, inspect(d));
    assert.deepEqual([d.field, d.response, d.record], ["minimum_isolation", "container", "process"]);
    assert.match(d.message, /default floor/);
  } finally {
    await proxy.close();
  }
});

test("an applied floor raised above the tier that ran is an evidence mismatch", async (t) => {
  if (!ready(t)) return;
  const proxy = await rewriting(undefined, (v) => {
    assert.equal(v.record.minimum_isolation, "process");
    v.record.minimum_isolation = "kernel";
    resign(v);
  });
  try {
    const e = await rejection(client(proxy.url).runJavaScript("console.log(1)", { minimum_isolation: "process" }));
    assert.ok(e instanceof EvidenceMismatchError, inspect(e));
    assert.deepEqual([e.isolation, e.floor, e.floorSource], ["process", "kernel", "record"]);
    assert.equal(notDispatchedReason(e), undefined);
  } finally {
    await proxy.close();
  }
});

test("a proxy that sends the run to another provider than the one named is a provider mismatch", async (t) => {
  if (!ready(t)) return;
  const proxy = await rewriting((v) => {
    assert.equal(v.provider, "crun");
    v.provider = "process";
  });
  try {
    const e = await rejection(client(proxy.url).runJavaScript("console.log(1)", { minimum_isolation: "process", provider: "crun" }));
    assert.ok(e instanceof ProviderMismatchError, inspect(e));
    assert.equal(e.asked, "crun");
    assert.equal(e.provider, "process");
    assert.equal(e.code, "evidence_mismatch");
    assert.equal(notDispatchedReason(e), undefined);
  } finally {
    await proxy.close();
  }
});

test("a proxy that rewrites the record or the response's tier is caught", async (t) => {
  if (!ready(t)) return;
  const cases: [Rewrite, (e: unknown) => void][] = [
    [
      (v) => {
        v.record.isolation = "vm";
      },
      (e) => {
        assert.ok(e instanceof DigestMismatchError && e.digest === "record", inspect(e));
      },
    ],
    [
      (v) => {
        v.isolation = "vm";
      },
      (e) => {
        assert.ok(e instanceof RecordMismatchError && e.field === "isolation", inspect(e));
      },
    ],
    [
      (v) => {
        v.request_id = "someone-else";
      },
      (e) => {
        assert.ok(e instanceof MayHaveRunError && e.kind === "request_id_mismatch", inspect(e));
        assert.equal(e.echoedRequestId, "someone-else");
      },
    ],
    [
      (v) => {
        v.result.extra = true;
      },
      (e) => {
        assert.ok(e instanceof MayHaveRunError && e.kind === "bad_response", inspect(e));
        assert.match(e.message, /unknown member `extra`/);
      },
    ],
  ];
  for (const [rewrite, check] of cases) {
    const proxy = await rewriting(undefined, rewrite);
    try {
      const e = await rejection(client(proxy.url).runJavaScript("console.log(1)", { minimum_isolation: "process" }));
      check(e);
      assert.equal(notDispatchedReason(e), undefined);
    } finally {
      await proxy.close();
    }
  }
});

test("a refusal whose echoed id is rewritten is not honoured", async (t) => {
  if (!ready(t)) return;
  for (const id of [null, "another-request"]) {
    const proxy = await rewriting(undefined, (v) => {
      assert.equal(typeof v.error.not_dispatched, "string");
      v.request_id = id;
    });
    try {
      const e = await rejection(client(proxy.url).runJavaScript("console.log(1)", { minimum_isolation: "vm" }));
      assert.ok(e instanceof MayHaveRunError && e.kind === "unverified_refusal", inspect(e));
      assert.deepEqual([e.code, e.claimedCode, e.claimedReason], ["unverified_refusal", "isolation", "isolation"]);
      assert.equal(e.echoedRequestId, id);
      assert.equal(notDispatchedReason(e), undefined);
    } finally {
      await proxy.close();
    }
  }
});

test("an answer whose nulls stand for absent members still verifies", async (t) => {
  if (!ready(t)) return;
  // Protocol 1: an optional member sent as null means the same as one left out.
  const proxy = await rewriting(undefined, (v) => {
    v.result.signal = null;
    v.result.steps = null;
    v.result.calls = null;
    v.result.oom_killed = null;
  });
  try {
    const res = await client(proxy.url).runJavaScript("console.log(1)", { minimum_isolation: "process" });
    assert.equal(res.result.oom_killed, false);
    assert.deepEqual(res.result.steps, []);
  } finally {
    await proxy.close();
  }
});

// ---------------------------------------------------------------------------------------
// The agent tool example.

test("the agent tool example returns output plus tier, and says when nothing ran", async (t) => {
  if (!ready(t)) return;
  const tool = runCodeTool(client(), { minimumIsolation: "process" });
  const ok = await tool.call({ language: "python", code: "print(6 * 7)" });
  assert.equal(ok.output, "42\n");
  assert.equal(ok.tier, "process");
  assert.equal(ok.ran, "yes");
  const strictTool = runCodeTool(client(), { minimumIsolation: "vm" });
  const refused = await strictTool.call({ language: "javascript", code: "console.log(1)" });
  assert.equal(refused.ran, "no");
  assert.equal(refused.tier, undefined);
  assert.match(refused.error ?? "", /isolation/);
});

// ---------------------------------------------------------------------------------------
// Exchanges that end badly after the request left: "may have run", never retried.

test("a connection reset after the run was sent is 'may have run', and the run did happen", async (t) => {
  if (!ready(t)) return;
  const proxy = await Proxy.start(daemon!.url, { kind: "reset" });
  try {
    const e = await rejection(client(proxy.url).runJavaScript("console.log(1)", { minimum_isolation: "process" }));
    assert.ok(e instanceof MayHaveRunError && e.kind === "transport", inspect(e));
    assert.equal(notDispatchedReason(e), undefined);
    assert.match(e.message, /may have run/);
    // Never retried: the proxy saw the one request.
    assert.equal(proxy.received, 1);
  } finally {
    await proxy.close();
  }
});

test("an answer that is neither a result nor an error, or a redirect, is 'may have run'", async (t) => {
  if (!ready(t)) return;
  const elsewhere = await Proxy.start(daemon!.url, { kind: "rewrite" });
  const cases = [
    { kind: "replace" as const, status: 502, body: "<html>bad gateway</html>" },
    { kind: "replace" as const, status: 200, body: "{}" },
    { kind: "replace" as const, status: 307, body: "", headers: { location: `${elsewhere.url}/v1/runs` } },
  ];
  try {
    for (const mode of cases) {
      const proxy = await Proxy.start(daemon!.url, mode);
      try {
        const e = await rejection(client(proxy.url).runJavaScript("console.log(1)", { minimum_isolation: "process" }));
        assert.ok(e instanceof MayHaveRunError && e.kind === "bad_response", inspect(e));
        assert.equal(e.status, mode.status);
        assert.equal(notDispatchedReason(e), undefined);
      } finally {
        await proxy.close();
      }
    }
    assert.equal(elsewhere.received, 0, "a redirect was followed");
  } finally {
    await elsewhere.close();
  }
});

test("an answer over the client's answer limit is 'may have run'", async (t) => {
  if (!ready(t)) return;
  const c = new Client({ url: daemon!.url, token: daemon!.token, maxAnswerBytes: 200 });
  const e = await rejection(c.runJavaScript("console.log('x'.repeat(1000))", { minimum_isolation: "process" }));
  assert.ok(e instanceof MayHaveRunError && e.kind === "transport", inspect(e));
  assert.match(e.message, /maxAnswerBytes/);
});

test("without a floor and without the daemon's default floor, nothing is sent", async (t) => {
  if (!ready(t)) return;
  // A bad token: GET /v1/providers is refused, so the client cannot learn the default floor.
  const proxy = await Proxy.start(daemon!.url, { kind: "rewrite" });
  try {
    const e = await rejection(new Client({ url: proxy.url, token: "plm_wrong" }).runJavaScript("console.log(1)"));
    assert.ok(e instanceof NotDispatchedError, inspect(e));
    assert.equal(e.reason, "permission");
    assert.equal(e.source, "client");
    assert.equal(proxy.received, 1, "only the providers lookup went out");
  } finally {
    await proxy.close();
  }
});

test("the agent tool example runs as a script and its process ends by itself", async (t) => {
  if (!ready(t)) return;
  const script = `${CLIENT_DIR}/build/examples/agent-tool.js`;
  // A clean environment; the child must exit on its own: no connection or timer keeps it.
  const stdout = await runNode(script, ["javascript", "console.log(6 * 7)", "process"], {
    PLIMSOLL_URL: daemon!.url,
    PLIMSOLL_TOKEN: daemon!.token,
  });
  const result = JSON.parse(stdout) as { ran: string; output: string; tier: string };
  assert.deepEqual([result.ran, result.output, result.tier], ["yes", "42\n", "process"]);
});

/** Runs a script with node in a clean environment; resolves to its stdout. */
function runNode(script: string, args: string[], env: Record<string, string>): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [script, ...args], { env, timeout: 30_000 }, (err, out, errText) =>
      err ? reject(new Error(`${err.message}\n${errText}`)) : resolve(out),
    );
  });
}

test("the README's quick start runs as written", async (t) => {
  if (!ready(t, "container")) return;
  const readme = readFileSync(`${CLIENT_DIR}/README.md`, "utf8");
  const block = /## Quick start[\s\S]*?```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  assert.ok(block !== undefined, "no quick start block in README.md");
  assert.ok(block.trim().split("\n").length <= 5, "the quick start is five lines at most");
  // Inside the package directory, so `@plimsoll/client` resolves to this package.
  const script = `${CLIENT_DIR}/build/quickstart.mjs`;
  writeFileSync(script, block);
  const out = await runNode(script, [], { PLIMSOLL_URL: daemon!.url, PLIMSOLL_TOKEN: daemon!.token });
  assert.equal(out, "42 container crun\n");
});

test("an abort after the request left is 'may have run'", async (t) => {
  if (!ready(t)) return;
  const abort = new AbortController();
  const pending = client().runJavaScript("setTimeout(() => {}, 1500)", {
    minimum_isolation: "process",
    limits: { timeout_ms: 2000 },
    signal: abort.signal,
  });
  setTimeout(() => abort.abort(), 300);
  const e = await rejection(pending);
  assert.ok(e instanceof MayHaveRunError && e.kind === "transport", inspect(e));
  assert.equal(notDispatchedReason(e), undefined);
});
