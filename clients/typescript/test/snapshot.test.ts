/**
 * Snapshots and forks through the client against a real plimsolld offering runsc, the one
 * provider whose sessions can be saved here (docs/sessions.md, "Snapshots and forks"): a
 * Python session holding `x = 41` snapshotted and going on, a session opened from the
 * snapshot and four forked copies each printing 42 (the copies each a random number of their
 * own), every record verified and carrying its session's origin; the refusals (an unknown or
 * another caller's snapshot, a JavaScript session, the session limits), each typed; and real
 * proxies on loopback that alter a fork's answer or a restored session's record, which the
 * client catches. Under CI=true a missing daemon binary, image or runsc fails these tests
 * instead of skipping them.
 * @module
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { after, before, test, type TestContext } from "node:test";
import { inspect } from "node:util";

import {
  Client,
  MayHaveRunError,
  NotDispatchedError,
  type Session,
  SessionMismatchError,
  decodeRunRecord,
  notDispatchedReason,
  recordSha256,
  text,
} from "@plimsoll/client";

import { LocalDaemon, missingForDaemon, missingForImage } from "./daemon.js";
import { CLIENT_DIR, strict } from "./paths.js";
import { Proxy, type Rewrite } from "./proxy.js";

/** A second caller, whose view of the first caller's snapshots is tested. */
const OTHER = "ts-other";

let daemon: LocalDaemon | undefined;
let setupProblem: string | undefined;

/** Says whether the test may go on; prints `SKIP` (or fails under CI=true) otherwise. */
function ready(t: TestContext): boolean {
  if (setupProblem === undefined) return true;
  if (strict()) assert.fail(`SKIP not allowed under CI=true: ${t.name}: ${setupProblem}`);
  console.error(`SKIP ${t.name}: ${setupProblem}`);
  t.skip(setupProblem);
  return false;
}

before(async () => {
  setupProblem = missingForDaemon() ?? missingForImage();
  if (setupProblem !== undefined) return;
  // runsc alone, no warm pools; room for a session, one restored from it and a fork of 4
  // (each open session holds one of max_concurrent's uid slots).
  daemon = await LocalDaemon.start({
    providers: ["runsc"],
    otherCallers: [OTHER],
    maxConcurrent: 8,
    sections: "[pools]\n\n[sessions]\nmax_total = 8\nmax_per_caller = 8\n",
  });
  const runsc = (await client().providers()).providers.find((p) => p.name === "runsc");
  if (runsc === undefined || !runsc.available) {
    setupProblem = `runsc is not available here: ${runsc?.unavailable_reason ?? "not listed"}`;
  }
});

after(async () => {
  await daemon?.stop();
});

function client(url = daemon!.url, token = daemon!.token): Client {
  return new Client({ url, token });
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

/**
 * Runs `f` with a list to put sessions in; every one of them not closed already is closed
 * after, whatever happens. A close that fails after `f` succeeded fails the test here: the
 * session left open would otherwise fail a later test (its session list, the daemon's
 * session limits), far from its cause. When `f` fails, the daemon's log is printed.
 */
async function closingAll<T>(f: (opened: Session[]) => Promise<T>): Promise<T> {
  const opened: Session[] = [];
  let result: T;
  try {
    result = await f(opened);
  } catch (e) {
    console.error(`plimsolld's log when this failed:\n${daemon?.tail(60) ?? "(no daemon)"}`);
    for (const s of opened) if (s.info.end_reason === undefined) await s.close().catch(() => undefined);
    throw e;
  }
  for (const s of opened) if (s.info.end_reason === undefined) await s.close();
  return result;
}

/** Opens a Python (or JavaScript) session at runsc. */
function openAtRunsc(c: Client, language: "python" | "javascript" = "python"): Promise<Session> {
  return c.openSession({ language, minimum_isolation: "container", provider: "runsc" });
}

/** Asserts `e` is the daemon's refusal `code` at `status`, echoing its id: nothing ran. */
function refused(e: unknown, code: string, status: number, reason: string, what = ""): void {
  assert.ok(e instanceof NotDispatchedError, `${what} ${inspect(e)}`);
  assert.deepEqual([e.code, e.status, e.reason, e.source], [code, status, reason, "daemon"], `${what} ${e.message}`);
  assert.equal(notDispatchedReason(e), reason, what);
}

// ---------------------------------------------------------------------------------------
// Snapshot, restore, fork.

test("a runsc session is snapshotted and goes on; restored and forked copies print 42, every record verified", async (t) => {
  if (!ready(t)) return;
  const c = client();
  await closingAll(async (opened) => {
    const parent = await openAtRunsc(c);
    opened.push(parent);
    assert.equal(parent.info.origin, undefined, "a session opened fresh has no origin");
    const first = await parent.cell("import random\nx = 41");
    assert.equal(first.result.exit_code, 0, text(first.result.stderr));
    assert.equal(first.record.session?.origin, undefined);

    const snap = await parent.snapshot();
    assert.match(snap.snapshot_id, /^snp_[0-9a-f]{16}_[0-9a-f]{32}$/);
    assert.match(snap.sha256, /^[0-9a-f]{64}$/);
    assert.deepEqual(
      [snap.session_id, snap.calls, snap.last_record_sha256, snap.provider, snap.language, snap.isolation],
      [parent.id, 1, first.record.record_sha256, "runsc", "python", parent.info.isolation],
    );
    assert.ok(snap.bytes > 0, inspect(snap));

    // The session goes on from where it stood, its chain unbroken.
    const goesOn = await parent.cell("y = 'after the snapshot'\nprint(x + 1)");
    assert.equal(text(goesOn.result.stdout), "42\n");
    assert.deepEqual(goesOn.record.session, { session_id: parent.id, sequence: 2, previous_record_sha256: first.record.record_sha256 });

    // A session opened from the snapshot: its state then, not the parent's since; its chain
    // goes on from the snapshot's, every record carrying its origin.
    const restored = await c.openSnapshot(snap);
    opened.push(restored);
    assert.notEqual(restored.id, parent.id);
    const origin = restored.info.origin;
    assert.deepEqual(origin, {
      start: "restored",
      snapshot_sha256: snap.sha256,
      parent_session_id: parent.id,
      parent_record_sha256: first.record.record_sha256,
      parent_calls: 1,
    });
    assert.deepEqual([restored.info.calls, restored.info.last_record_sha256], [1, first.record.record_sha256]);
    const r = await restored.cell("print(x + 1, 'y' in globals())");
    assert.equal(text(r.result.stdout), "42 False\n");
    assert.deepEqual(r.record.session, { session_id: restored.id, sequence: 2, previous_record_sha256: first.record.record_sha256, origin });
    assert.equal(recordSha256(r.record), r.record.record_sha256);
    const steps = await restored.steps(["echo on"]);
    assert.deepEqual(steps.record.session, { session_id: restored.id, sequence: 3, previous_record_sha256: r.record.record_sha256, origin });
    // The daemon shows it the same way.
    assert.deepEqual((await restored.refresh()).origin, origin);

    // A fork into 4 after the parent's second call.
    const fork = await parent.fork(4);
    opened.push(...fork.sessions);
    assert.equal(fork.sessions.length, 4);
    assert.notEqual(fork.snapshot.snapshot_id, snap.snapshot_id);
    assert.deepEqual(
      [fork.snapshot.session_id, fork.snapshot.calls, fork.snapshot.last_record_sha256],
      [parent.id, 2, goesOn.record.record_sha256],
    );
    const randoms = new Set<string>();
    for (const copy of fork.sessions) {
      assert.deepEqual(copy.info.origin, {
        start: "forked",
        snapshot_sha256: fork.snapshot.sha256,
        parent_session_id: parent.id,
        parent_record_sha256: goesOn.record.record_sha256,
        parent_calls: 2,
      });
      const res = await copy.cell("print(x + 1, y, random.random())");
      const [answer, , , , random] = text(res.result.stdout).trim().split(" ");
      assert.equal(answer, "42", text(res.result.stdout));
      randoms.add(random!);
      assert.deepEqual(res.record.session, {
        session_id: copy.id,
        sequence: 3,
        previous_record_sha256: goesOn.record.record_sha256,
        origin: copy.info.origin,
      });
      assert.equal(recordSha256(res.record), res.record.record_sha256);
    }
    assert.equal(randoms.size, 4, `every copy draws a random.random() of its own: ${[...randoms].join(", ")}`);
    assert.equal(new Set(fork.sessions.map((s) => s.id)).size, 4);

    // The parent is unchanged by the fork: its third call, no origin, a random of its own.
    const third = await parent.cell("print(random.random())");
    assert.deepEqual(third.record.session, { session_id: parent.id, sequence: 3, previous_record_sha256: goesOn.record.record_sha256 });
    assert.ok(!randoms.has(text(third.result.stdout).trim()), "the parent repeats a copy's random");

    // Both snapshots listed, oldest first, as they were answered (no request id in a list).
    const { request_id: _a, ...listedSnap } = snap;
    const { request_id: _b, ...listedFork } = fork.snapshot;
    assert.deepEqual((await c.listSnapshots()).snapshots, [listedSnap, listedFork]);
    // Deleted: gone from the list, and its id unknown.
    const gone = await c.deleteSnapshot(snap);
    assert.deepEqual({ ...gone, request_id: undefined }, { ...snap, request_id: undefined });
    refused(await rejection(c.openSnapshot(snap)), "snapshot_not_found", 404, "request");
    refused(await rejection(c.deleteSnapshot(snap.snapshot_id)), "snapshot_not_found", 404, "request");
    await c.deleteSnapshot(fork.snapshot.snapshot_id);
    assert.deepEqual((await c.listSnapshots()).snapshots, []);
    // Copies live on without their snapshot.
    const later = await fork.sessions[0]!.cell("print(x)");
    assert.equal(text(later.result.stdout), "41\n");
    assert.equal(later.record.session?.sequence, 4);
  });
});

// ---------------------------------------------------------------------------------------
// Refusals: each typed, each saying nothing ran.

test("an unknown snapshot and another caller's are both snapshot_not_found; a wrong digest opens nothing", async (t) => {
  if (!ready(t)) return;
  const c = client();
  const other = client(daemon!.url, daemon!.tokenOf(OTHER));
  await closingAll(async (opened) => {
    const parent = await openAtRunsc(c);
    opened.push(parent);
    await parent.cell("x = 41");
    const snap = await parent.snapshot();
    const unknown = `snp_${snap.snapshot_id.slice(4, 20)}_${"0".repeat(32)}`;
    for (const [who, as, id] of [
      ["another caller's", other, snap.snapshot_id],
      ["an unknown", c, unknown],
    ] as const) {
      refused(await rejection(as.openSnapshot(id)), "snapshot_not_found", 404, "request", `opening ${who}`);
      refused(await rejection(as.deleteSnapshot(id)), "snapshot_not_found", 404, "request", `deleting ${who}`);
    }
    assert.deepEqual((await other.listSnapshots()).snapshots, [], "another caller lists none of them");
    // The digest named is not the snapshot's: refused, nothing opened.
    refused(await rejection(c.openSnapshot(snap.snapshot_id, { sha256: "0".repeat(64) })), "request", 400, "request");
    assert.deepEqual(
      (await c.listSessions()).sessions.map((s) => s.session_id),
      [parent.id],
    );
    // Still there for its caller.
    assert.deepEqual((await c.listSnapshots()).snapshots.map((s) => s.snapshot_id), [snap.snapshot_id]);
    await c.deleteSnapshot(snap);
  });
});

test("a JavaScript session cannot be snapshotted or forked (unsupported), and goes on", async (t) => {
  if (!ready(t)) return;
  const c = client();
  await closingAll(async (opened) => {
    const js = await openAtRunsc(c, "javascript");
    opened.push(js);
    for (const attempt of [() => js.snapshot(), () => js.fork(2)]) {
      const e = await rejection(attempt());
      refused(e, "unsupported", 422, "unsupported");
      assert.match((e as Error).message, /crypto\.randomBytes/);
    }
    const after = await js.cell("console.log(6 * 7)");
    assert.equal(text(after.result.stdout), "42\n");
    assert.equal(after.record.session?.sequence, 1);
    assert.deepEqual((await c.listSnapshots()).snapshots, []);
  });
});

test("a fork over the session limits is refused (capacity), and one over max_fork or of 0 too, nothing taken", async (t) => {
  if (!ready(t)) return;
  const c = client();
  await closingAll(async (opened) => {
    const parent = await openAtRunsc(c);
    opened.push(parent);
    // max_per_caller = 8 with one open: 8 more are one too many.
    refused(await rejection(parent.fork(8)), "capacity", 429, "capacity");
    // The daemon's max_fork is 8.
    refused(await rejection(parent.fork(9)), "request", 400, "request");
    // Refused here, unsent.
    for (const count of [0, -1, 1.5, Number.NaN]) {
      const e = await rejection(parent.fork(count));
      assert.ok(e instanceof NotDispatchedError, inspect(e));
      assert.deepEqual([e.reason, e.source], ["request", "client"]);
    }
    assert.deepEqual((await c.listSnapshots()).snapshots, [], "no snapshot was kept");
    assert.deepEqual((await c.listSessions()).sessions.map((s) => s.session_id), [parent.id]);
    assert.equal((await parent.cell("print(1)")).record.session?.sequence, 1);
  });
});

// ---------------------------------------------------------------------------------------
// Parties in the middle: real answers, altered on the way.

test("a fork answer whose copy names another parent is refused, and its copies closed again", async (t) => {
  if (!ready(t)) return;
  const c = client();
  const elsewhere = `ses_${"1".repeat(16)}_${"2".repeat(32)}`;
  const cases: [string, Rewrite, (e: unknown) => void][] = [
    [
      "another parent",
      (v) => {
        v.sessions[1].origin.parent_session_id = elsewhere;
      },
      (e) => assert.ok(e instanceof SessionMismatchError && e.field === "origin.parent_session_id" && e.found === elsewhere, inspect(e)),
    ],
    [
      "no origin",
      (v) => {
        delete v.sessions[0].origin;
      },
      (e) => assert.ok(e instanceof SessionMismatchError && e.field === "origin" && e.found === undefined, inspect(e)),
    ],
    [
      "a chain that does not start at the snapshot",
      (v) => {
        v.sessions[0].calls = 0;
        delete v.sessions[0].last_record_sha256;
      },
      (e) => assert.ok(e instanceof SessionMismatchError && e.field === "calls", inspect(e)),
    ],
  ];
  for (const [what, rewrite, check] of cases) {
    await closingAll(async (opened) => {
      const parent = await openAtRunsc(c);
      opened.push(parent);
      await parent.cell("x = 41");
      const proxy = await Proxy.start(daemon!.url, {
        kind: "rewrite",
        // Only a fork's answer is altered: a refusal passes as the daemon gave it, so the
        // test fails saying what the daemon said, not that the proxy could not rewrite it.
        response: (v) => (Array.isArray(v?.sessions) ? rewrite(v) : undefined),
        match: (m, url) => m === "POST" && url === `/v1/sessions/${parent.id}/fork`,
      });
      try {
        const viaProxy = await client(proxy.url).session(parent.id);
        const e = await rejection(viaProxy.fork(2));
        check(e);
        assert.ok(e instanceof MayHaveRunError && e.closeError === undefined, `${what}: ${inspect(e)}`);
        assert.equal(notDispatchedReason(e), undefined, what);
      } finally {
        await proxy.close();
      }
      // Both copies were closed again; the parent goes on.
      assert.deepEqual((await c.listSessions()).sessions.map((s) => s.session_id), [parent.id], what);
      assert.equal((await parent.cell("print(x + 1)")).record.session?.sequence, 2, what);
      for (const s of (await c.listSnapshots()).snapshots) await c.deleteSnapshot(s);
    });
  }
});

test("a restored session's record whose origin was altered (its digest recomputed) is a session mismatch", async (t) => {
  if (!ready(t)) return;
  const c = client();
  const cases: [string, Rewrite, string][] = [
    [
      "parent_calls changed",
      (v) => {
        v.record.session.origin.parent_calls += 1;
      },
      "origin.parent_calls",
    ],
    [
      "restored read as forked",
      (v) => {
        v.record.session.origin.start = "forked";
      },
      "origin.start",
    ],
    [
      "the origin removed",
      (v) => {
        delete v.record.session.origin;
      },
      "origin",
    ],
  ];
  await closingAll(async (opened) => {
    const parent = await openAtRunsc(c);
    opened.push(parent);
    await parent.cell("x = 41");
    const snap = await parent.snapshot();
    for (const [what, rewrite, field] of cases) {
      const restored = await c.openSnapshot(snap);
      opened.push(restored);
      const proxy = await Proxy.start(daemon!.url, {
        kind: "rewrite",
        response: (v) => {
          rewrite(v);
          v.record.record_sha256 = recordSha256(decodeRunRecord(JSON.stringify(v.record)));
        },
        match: (m, url) => m === "POST" && url === `/v1/sessions/${restored.id}/cells`,
      });
      try {
        const viaProxy = await client(proxy.url).session(restored.id);
        const e = await rejection(viaProxy.cell("print(x + 1)"));
        assert.ok(e instanceof SessionMismatchError, `${what}: ${inspect(e)}`);
        assert.equal(e.field, field, what);
        assert.equal(notDispatchedReason(e), undefined, what);
      } finally {
        await proxy.close();
      }
      // Unaltered, the same session's next call verifies (the altered one ran: sequence 3).
      await restored.resync();
      const next = await restored.cell("print(x + 1)");
      assert.deepEqual([text(next.result.stdout), next.record.session?.sequence], ["42\n", 3], what);
      await restored.close();
    }
    await c.deleteSnapshot(snap);
  });
});

test("the README's snapshots example runs as written", async (t) => {
  if (!ready(t)) return;
  const readme = readFileSync(`${CLIENT_DIR}/README.md`, "utf8");
  const block = /### Snapshots and forks[\s\S]*?```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  assert.ok(block !== undefined, "no snapshots block in README.md");
  // Inside the package directory, so `@plimsoll/client` resolves to this package.
  const script = `${CLIENT_DIR}/build/snapshots-readme.mjs`;
  writeFileSync(script, block);
  const out = await new Promise<string>((resolve, reject) => {
    execFile(
      process.execPath,
      [script],
      { env: { PLIMSOLL_URL: daemon!.url, PLIMSOLL_TOKEN: daemon!.token }, timeout: 120_000 },
      (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout)),
    );
  });
  assert.equal(out, "42 2 restored\n42 2 forked\n42 2 forked\n");
  assert.deepEqual((await client().listSessions()).sessions, [], "the example closed its sessions");
  assert.deepEqual((await client().listSnapshots()).snapshots, [], "the example deleted its snapshots");
});
