/**
 * Snapshots and forks without a daemon: a session's origin read strictly and digested as
 * record field 14, and the checks on a snapshot, a fork's copies, a session opened from a
 * snapshot and every record of such a session; and a session that outlives a daemon restart,
 * restored under its own id (its origin changes at the call after its last saved one, and
 * nowhere else). The answers are synthetic, from a small HTTP server on loopback (not a
 * daemon), and every digest in them is right: only the origin and chain checks can fail them.
 * @module
 */

import assert from "node:assert/strict";
import { type IncomingMessage, type Server, type ServerResponse, createServer } from "node:http";
import { after, before, beforeEach, test } from "node:test";
import { inspect } from "node:util";

import {
  Client,
  EvidenceMismatchError,
  MayHaveRunError,
  NotDispatchedError,
  type Session,
  SessionLookupError,
  type SessionOrigin,
  SessionMismatchError,
  ShapeError,
  type SnapshotInfo,
  decodeForkAnswer,
  decodeRunRecord,
  decodeRunRequest,
  decodeRunResult,
  decodeSessionInfo,
  decodeSnapshotInfo,
  notDispatchedReason,
  recordSha256,
  requestSha256,
  resultSha256,
} from "@plimsoll/client";

const INSTANCE = "0123456789abcdef";
const PARENT = `ses_${INSTANCE}_${"ab".repeat(16)}`;
const SNAPSHOT = `snp_${INSTANCE}_${"cd".repeat(16)}`;
const SNAPSHOT_SHA = "5a".repeat(32);
const ELSEWHERE = `ses_${INSTANCE}_${"ef".repeat(16)}`;

/** The nth new session id this server hands out. */
const newId = (n: number): string => `ses_${INSTANCE}_${n.toString(16).padStart(32, "0")}`;

// ---------------------------------------------------------------------------------------
// The wire.

const origin: SessionOrigin = {
  start: "forked",
  snapshot_sha256: SNAPSHOT_SHA,
  parent_session_id: PARENT,
  parent_record_sha256: "1e".repeat(32),
  parent_calls: 2,
};

const record = {
  request_id: "r-1",
  request_sha256: "3e".repeat(32),
  result_sha256: "9f".repeat(32),
  provider: "runsc",
  isolation: "kernel",
  minimum_isolation: "container",
  evidence_sha256: "7e".repeat(32),
  environment: `sha256:${"5f".repeat(32)}`,
  started_unix_ms: 1,
  ended_unix_ms: 2,
  session: { session_id: newId(1), sequence: 3, previous_record_sha256: "1e".repeat(32), origin },
  record_sha256: "",
};

const snapshotInfo: SnapshotInfo = {
  protocol: 1,
  request_id: "r-snap",
  snapshot_id: SNAPSHOT,
  session_id: PARENT,
  sha256: SNAPSHOT_SHA,
  bytes: 4096,
  provider: "runsc",
  isolation: "kernel",
  language: "python",
  calls: 2,
  last_record_sha256: "1e".repeat(32),
  checkpoint_ms: 120,
  created_unix_ms: 1,
  expires_unix_ms: 3600001,
};

test("a record's origin is field 14: every member is in the digest, absent and null the same", () => {
  const withOrigin = decodeRunRecord(JSON.stringify(record));
  assert.deepEqual(withOrigin.session?.origin, origin);
  const { origin: _, ...plainLink } = record.session;
  const without = decodeRunRecord(JSON.stringify({ ...record, session: plainLink }));
  assert.equal(recordSha256(decodeRunRecord(JSON.stringify({ ...record, session: { ...plainLink, origin: null } }))), recordSha256(without));
  assert.notEqual(recordSha256(withOrigin), recordSha256(without));
  const changes: [keyof SessionOrigin, unknown][] = [
    ["start", "restored"],
    ["snapshot_sha256", "5b".repeat(32)],
    ["parent_session_id", ELSEWHERE],
    ["parent_record_sha256", "1f".repeat(32)],
    ["parent_calls", 3],
  ];
  for (const [member, value] of changes) {
    const changed = decodeRunRecord(JSON.stringify({ ...record, session: { ...record.session, origin: { ...origin, [member]: value } } }));
    assert.notEqual(recordSha256(changed), recordSha256(withOrigin), member);
  }
  const { parent_record_sha256: _p, ...noParentRecord } = origin;
  for (const absent of [noParentRecord, { ...origin, parent_record_sha256: null }]) {
    const r = decodeRunRecord(JSON.stringify({ ...record, session: { ...record.session, origin: absent } }));
    assert.equal("parent_record_sha256" in r.session!.origin!, false);
    assert.notEqual(recordSha256(r), recordSha256(withOrigin));
  }
});

test("origins, snapshots and fork answers are read strictly", () => {
  const bad: [string, () => unknown, RegExp][] = [
    ["an unknown origin member", () => decodeRunRecord(JSON.stringify({ ...record, session: { ...record.session, origin: { ...origin, depth: 1 } } })), /unknown member `depth`/],
    ["an unknown start", () => decodeRunRecord(JSON.stringify({ ...record, session: { ...record.session, origin: { ...origin, start: "cloned" } } })), /not a session start/],
    ["a missing parent", () => decodeRunRecord(JSON.stringify({ ...record, session: { ...record.session, origin: { ...origin, parent_session_id: null } } })), /parent_session_id: missing/],
    ["negative parent calls", () => decodeRunRecord(JSON.stringify({ ...record, session: { ...record.session, origin: { ...origin, parent_calls: -1 } } })), /out of range/],
    ["an unknown snapshot member", () => decodeSnapshotInfo(JSON.stringify({ ...snapshotInfo, path: "/var" })), /unknown member `path`/],
    ["a snapshot without its digest", () => decodeSnapshotInfo(JSON.stringify({ ...snapshotInfo, sha256: undefined })), /sha256: missing/],
    ["an unknown fork member", () => decodeForkAnswer(JSON.stringify({ protocol: 1, request_id: "r", snapshot: snapshotInfo, sessions: [], tree: [] })), /unknown member `tree`/],
    ["a fork without copies", () => decodeForkAnswer(JSON.stringify({ protocol: 1, request_id: "r", snapshot: snapshotInfo })), /sessions: missing/],
  ];
  for (const [what, read, says] of bad) {
    assert.throws(read, (e) => e instanceof ShapeError && says.test(e.message), what);
  }
  // Null reads as absent.
  const { request_id: _r, last_record_sha256: _l, ...listed } = snapshotInfo;
  assert.deepEqual(decodeSnapshotInfo(JSON.stringify({ ...snapshotInfo, request_id: null, last_record_sha256: null, calls: 0 })), { ...listed, calls: 0 });
  const info = sessionInfo(newId(1), { origin: { ...origin, start: "restored" } });
  assert.equal(decodeSessionInfo(JSON.stringify(info)).origin?.start, "restored");
  assert.equal("origin" in decodeSessionInfo(JSON.stringify({ ...info, origin: null })), false);
});

// ---------------------------------------------------------------------------------------
// A synthetic server: honest answers with every digest right, altered by the hooks below.

/** An answer's JSON, as a hook alters it. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = Record<string, any>;

interface Chain {
  calls: number;
  last: string | undefined;
  origin: SessionOrigin | undefined;
  /** Its tier and evidence digest, when a restart changed them (else the constants). */
  isolation?: string;
  evidence?: string;
}

const EVIDENCE = "7e".repeat(32);
/** The digest of the files a restart saved a session into. */
const SAVED_SHA = "6b".repeat(32);

/** What the server does; reset before each test. */
const serve = {
  /** Each session's chain, by id. */
  chains: new Map<string, Chain>(),
  /** How many session ids it has handed out. */
  made: 0,
  /** Alters an answer's JSON before it is sent (the record's digest is recomputed after). */
  alterFork: undefined as ((answer: Json) => void) | undefined,
  alterSnapshot: undefined as ((answer: Json) => void) | undefined,
  alterRestored: undefined as ((answer: Json) => void) | undefined,
  alterRecord: undefined as ((record: Json) => void) | undefined,
  /** Alters a session's info as `GET /v1/sessions/{id}` shows it. */
  alterShown: undefined as ((info: Json) => void) | undefined,
  /** Answered instead, for a refusal: status and body (`{id}` becomes the request id). */
  refuse: undefined as { status: number; code: string; reason: string; echo: boolean } | undefined,
  /** Requests seen: method and path. */
  seen: [] as { method: string; path: string }[],
};

function sessionInfo(id: string, extra: Record<string, unknown> = {}): Json {
  return {
    protocol: 1,
    session_id: id,
    language: "python",
    provider: "runsc",
    isolation: "kernel",
    minimum_isolation: "container",
    evidence_sha256: "7e".repeat(32),
    environment: `sha256:${"5f".repeat(32)}`,
    wall: { uid: 1, euid: 1, gid: 1, root_read_only: true },
    opened_unix_ms: 1,
    expires_unix_ms: 2,
    idle_timeout_ms: 300000,
    calls: 0,
    interpreter_alive: true,
    ...extra,
  };
}

/** A session's info as its chain stands. */
function shown(id: string, requestId?: string, extra: Record<string, unknown> = {}): Json {
  const c = serve.chains.get(id)!;
  return sessionInfo(id, {
    ...(requestId === undefined ? {} : { request_id: requestId }),
    isolation: c.isolation ?? "kernel",
    evidence_sha256: c.evidence ?? EVIDENCE,
    calls: c.calls,
    ...(c.last === undefined ? {} : { last_record_sha256: c.last }),
    ...(c.origin === undefined ? {} : { origin: c.origin }),
    ...extra,
  });
}

/** A snapshot of session `id` where its chain stands. */
function snapshotOf(id: string, requestId: string | undefined): Json {
  const c = serve.chains.get(id)!;
  return {
    ...snapshotInfo,
    request_id: requestId,
    session_id: id,
    calls: c.calls,
    last_record_sha256: c.last,
  };
}

/** A new session copied from `parent`'s chain. */
function copyOf(parent: string, start: "restored" | "forked", requestId: string): Json {
  const p = serve.chains.get(parent)!;
  const id = newId(++serve.made);
  const o: SessionOrigin = { start, snapshot_sha256: SNAPSHOT_SHA, parent_session_id: parent, parent_calls: p.calls };
  if (p.last !== undefined) o.parent_record_sha256 = p.last;
  serve.chains.set(id, { calls: p.calls, last: p.last, origin: o });
  return shown(id, requestId);
}

/**
 * The daemon restarted: session `id` saved where its chain stands and restored under its own
 * id, its records saying so from its next call on, at the tier and evidence given.
 */
function restart(id: string, at: { isolation?: string; evidence?: string } = {}): SessionOrigin {
  const c = serve.chains.get(id)!;
  const o: SessionOrigin = { start: "restored", snapshot_sha256: SAVED_SHA, parent_session_id: id, parent_calls: c.calls };
  if (c.last !== undefined) o.parent_record_sha256 = c.last;
  c.origin = o;
  if (at.isolation !== undefined) c.isolation = at.isolation;
  if (at.evidence !== undefined) c.evidence = at.evidence;
  return structuredClone(o);
}

/** An honest answer to a cell `body` of session `id`, the next link of its chain. */
function cellAnswer(id: string, body: string): Json {
  const req = decodeRunRequest(body);
  const c = serve.chains.get(id)!;
  const result = { exit_code: 0, timed_out: false, stdout: "42\n", stdout_truncated: false, stderr: "", stderr_truncated: false, state_kept: true };
  const link: Record<string, unknown> = { session_id: id, sequence: c.calls + 1 };
  if (c.last !== undefined) link.previous_record_sha256 = c.last;
  if (c.origin !== undefined) link.origin = c.origin;
  const rec: Json = {
    request_id: req.request_id,
    request_sha256: requestSha256(req),
    result_sha256: resultSha256(decodeRunResult(JSON.stringify(result))),
    provider: "runsc",
    isolation: c.isolation ?? "kernel",
    minimum_isolation: "container",
    evidence_sha256: c.evidence ?? EVIDENCE,
    environment: `sha256:${"5f".repeat(32)}`,
    started_unix_ms: 1,
    ended_unix_ms: 2,
    session: structuredClone(link),
    record_sha256: "",
  };
  serve.alterRecord?.(rec);
  rec.record_sha256 = recordSha256(decodeRunRecord(JSON.stringify(rec)));
  c.calls += 1;
  c.last = rec.record_sha256;
  return { protocol: 1, request_id: req.request_id, provider: "runsc", isolation: rec.isolation, duration_ms: 1, request_sha256: rec.request_sha256, result_sha256: rec.result_sha256, result, record: rec };
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}

async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
  const body = await readBody(req);
  const method = req.method ?? "";
  const path = req.url ?? "";
  serve.seen.push({ method, path });
  const requestId = body === "" ? String(req.headers["plimsoll-request-id"]) : (JSON.parse(body) as { request_id: string }).request_id;
  const send = (v: unknown, status = 200): void => {
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(v));
  };
  const [, , kind, id, sub] = path.split("/");
  if (serve.refuse !== undefined && method === "POST" && (sub === "snapshot" || sub === "fork" || kind === "snapshots")) {
    const r = serve.refuse;
    send({ protocol: 1, request_id: r.echo ? requestId : "another-request", error: { code: r.code, message: `refused: ${r.code}`, not_dispatched: r.reason } }, r.status);
  } else if (method === "POST" && path === "/v1/sessions") {
    serve.chains.set(PARENT, { calls: 0, last: undefined, origin: undefined });
    send(shown(PARENT, requestId));
  } else if (method === "POST" && kind === "sessions" && sub === "cells") {
    send(cellAnswer(id!, body));
  } else if (method === "POST" && kind === "sessions" && sub === "snapshot") {
    const answer = snapshotOf(id!, requestId);
    serve.alterSnapshot?.(answer);
    send(answer);
  } else if (method === "POST" && kind === "sessions" && sub === "fork") {
    const { count } = JSON.parse(body) as { count: number };
    const answer = {
      protocol: 1,
      request_id: requestId,
      snapshot: snapshotOf(id!, requestId),
      sessions: Array.from({ length: count }, () => copyOf(id!, "forked", requestId)),
    };
    serve.alterFork?.(answer);
    send(answer);
  } else if (method === "POST" && kind === "snapshots" && id === SNAPSHOT && sub === "sessions") {
    const answer = copyOf(PARENT, "restored", requestId);
    serve.alterRestored?.(answer);
    send(answer);
  } else if (method === "DELETE" && kind === "sessions" && serve.chains.has(id!)) {
    send(shown(id!, requestId, { end_reason: "closed", interpreter_alive: false }));
    serve.chains.delete(id!);
  } else if (method === "GET" && kind === "sessions" && serve.chains.has(id!)) {
    const info = shown(id!);
    serve.alterShown?.(info);
    send(info);
  } else {
    res.writeHead(404).end();
  }
}

let server: Server;
let url = "";

before(async () => {
  server = createServer((req, res) => {
    handle(req, res).catch((e: unknown) => {
      res.writeHead(500).end(String(e));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const addr = server.address();
  assert.ok(addr !== null && typeof addr !== "string");
  url = `http://127.0.0.1:${addr.port}`;
});

after(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

beforeEach(() => {
  serve.chains.clear();
  serve.made = 0;
  serve.alterFork = undefined;
  serve.alterSnapshot = undefined;
  serve.alterRestored = undefined;
  serve.alterRecord = undefined;
  serve.alterShown = undefined;
  serve.refuse = undefined;
  serve.seen = [];
});

const client = (): Client => new Client({ url, token: "t" });

/** The parent: a session opened, with one call answered. */
async function parent(): Promise<Session> {
  const s = await client().openSession({ language: "python", minimum_isolation: "container", provider: "runsc" });
  await s.cell("x = 41");
  return s;
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

/** The ids of the sessions the client closed since `from` (in `serve.seen`). */
const closedSince = (from: number): string[] =>
  serve.seen.slice(from).filter((r) => r.method === "DELETE").map((r) => r.path.split("/")[3]!);

test("an honest fork and restore verify, each copy's chain going on from its parent's", async () => {
  const p = await parent();
  const fork = await p.fork(3);
  assert.deepEqual([fork.snapshot.calls, fork.snapshot.last_record_sha256], [1, p.info.last_record_sha256]);
  for (const copy of fork.sessions) {
    assert.deepEqual([copy.info.calls, copy.info.origin?.parent_session_id, copy.info.origin?.start], [1, PARENT, "forked"]);
    const res = await copy.cell("print(x + 1)");
    assert.deepEqual(res.record.session, { session_id: copy.id, sequence: 2, previous_record_sha256: p.info.last_record_sha256, origin: copy.info.origin });
    assert.equal((await copy.cell("print(x + 1)")).record.session?.sequence, 3);
  }
  const snap = await p.snapshot();
  const restored = await client().openSnapshot(snap, { minimum_isolation: "kernel" });
  assert.equal(restored.info.origin?.start, "restored");
  assert.equal((await restored.cell("print(x + 1)")).record.session?.sequence, 2);
  // An id alone: nothing is known of the snapshot but what the answer says.
  const byId = await client().openSnapshot(SNAPSHOT);
  assert.equal(byId.info.origin?.parent_session_id, PARENT);
});

test("a fork answer whose copy names another parent, snapshot or place in its chain is refused, its copies closed", async () => {
  const cases: [string, (a: Json) => void, string][] = [
    ["another parent", (a) => (a.sessions[1].origin.parent_session_id = ELSEWHERE), "origin.parent_session_id"],
    ["restored, not forked", (a) => (a.sessions[0].origin.start = "restored"), "origin.start"],
    ["another snapshot", (a) => (a.sessions[0].origin.snapshot_sha256 = "5b".repeat(32)), "origin.snapshot_sha256"],
    ["another place in the parent's chain", (a) => (a.sessions[0].origin.parent_calls = 0), "origin.parent_calls"],
    ["no parent record", (a) => delete a.sessions[0].origin.parent_record_sha256, "origin.parent_record_sha256"],
    ["no origin", (a) => delete a.sessions[1].origin, "origin"],
    ["a chain starting elsewhere", (a) => (a.sessions[0].calls = 5), "calls"],
    ["a last record of its own", (a) => (a.sessions[0].last_record_sha256 = "00".repeat(32)), "last_record_sha256"],
    ["another language", (a) => (a.sessions[0].language = "javascript"), "language"],
    ["another floor", (a) => (a.sessions[0].minimum_isolation = "process"), "minimum_isolation"],
    ["the snapshot of another session", (a) => (a.snapshot.session_id = ELSEWHERE), "session_id"],
    [
      "the snapshot at another call",
      (a) => {
        a.snapshot.calls = 0;
        delete a.snapshot.last_record_sha256;
      },
      "calls",
    ],
  ];
  for (const [what, alter, field] of cases) {
    const p = await parent();
    serve.alterFork = alter;
    const from = serve.seen.length;
    const e = await rejection(p.fork(2));
    assert.ok(e instanceof SessionMismatchError, `${what}: ${inspect(e)}`);
    assert.equal(e.field, field, what);
    assert.equal(notDispatchedReason(e), undefined, what);
    assert.equal(e.closeError, undefined, what);
    // Both copies the answer named were closed again, never the parent.
    assert.deepEqual(closedSince(from), [newId(serve.made - 1), newId(serve.made)], what);
    serve.alterFork = undefined;
    // The parent goes on: a fork is no link of its chain.
    assert.equal((await p.cell("print(1)")).record.session?.sequence, 2, what);
  }
});

test("a fork answer not for this request, or of another count, or naming the parent as a copy, is refused", async () => {
  const cases: [string, (a: Json) => void, (e: unknown) => boolean][] = [
    ["another request id", (a) => (a.request_id = "another"), (e) => e instanceof MayHaveRunError && e.kind === "request_id_mismatch"],
    ["a copy for another request", (a) => (a.sessions[0].request_id = "another"), (e) => e instanceof MayHaveRunError && e.kind === "request_id_mismatch"],
    ["one copy missing", (a) => a.sessions.pop(), (e) => e instanceof MayHaveRunError && e.kind === "bad_response" && /1 copies, not the 2/.test(e.message)],
    ["the parent as a copy", (a) => (a.sessions[0].session_id = PARENT), (e) => e instanceof MayHaveRunError && e.kind === "bad_response" && /named twice, or is the session forked/.test(e.message)],
  ];
  for (const [what, alter, check] of cases) {
    const p = await parent();
    serve.alterFork = alter;
    const from = serve.seen.length;
    const e = await rejection(p.fork(2));
    assert.ok(check(e), `${what}: ${inspect(e)}`);
    assert.ok(!closedSince(from).includes(PARENT), `${what}: the parent was closed`);
  }
});

test("a record whose origin differs from its session's is a session mismatch, and puts the chain in doubt", async () => {
  const cases: [string, boolean, (r: Json) => void, string][] = [
    ["another parent", true, (r) => (r.session.origin.parent_session_id = ELSEWHERE), "origin.parent_session_id"],
    ["another snapshot", true, (r) => (r.session.origin.snapshot_sha256 = "5b".repeat(32)), "origin.snapshot_sha256"],
    ["the parent's record dropped", true, (r) => delete r.session.origin.parent_record_sha256, "origin.parent_record_sha256"],
    ["forked read as restored", true, (r) => (r.session.origin.start = "restored"), "origin.start"],
    ["the origin dropped", true, (r) => delete r.session.origin, "origin"],
    ["an origin on a fresh session's record", false, (r) => (r.session.origin = origin), "origin"],
  ];
  for (const [what, copied, alter, field] of cases) {
    const p = await parent();
    const s = copied ? (await p.fork(1)).sessions[0]! : p;
    serve.alterRecord = alter;
    const e = await rejection(s.cell("print(x + 1)"));
    serve.alterRecord = undefined;
    assert.ok(e instanceof SessionMismatchError, `${what}: ${inspect(e)}`);
    assert.equal(e.field, field, what);
    assert.equal(notDispatchedReason(e), undefined, what);
    const doubt = await rejection(s.cell("print(1)"));
    assert.ok(doubt instanceof NotDispatchedError && doubt.code === "chain_in_doubt", `${what}: ${inspect(doubt)}`);
    // So is a snapshot or a fork of it, until the daemon's word is taken.
    const aside = await rejection(s.fork(1));
    assert.ok(aside instanceof NotDispatchedError && aside.code === "chain_in_doubt", `${what}: ${inspect(aside)}`);
    await s.resync();
    await s.cell("print(1)");
  }
});

test("a session opened from a snapshot must say it was restored from that snapshot, else it is closed again", async () => {
  const cases: [string, (a: Json) => void, string, boolean][] = [
    ["forked, not restored", (a) => (a.origin.start = "forked"), "origin.start", false],
    ["another digest than the one asked for", (a) => (a.origin.snapshot_sha256 = "5b".repeat(32)), "origin.snapshot_sha256", false],
    ["another parent than the snapshot's", (a) => (a.origin.parent_session_id = ELSEWHERE), "origin.parent_session_id", true],
    [
      "another place than the snapshot's",
      (a) => {
        a.origin.parent_calls = 7;
        a.calls = 7;
      },
      "origin.parent_calls",
      true,
    ],
    ["no origin", (a) => delete a.origin, "origin", false],
    ["a chain that starts elsewhere", (a) => (a.calls = 0), "calls", false],
  ];
  const p = await parent();
  const snap = await p.snapshot();
  for (const [what, alter, field, needsKnown] of cases) {
    serve.alterRestored = alter;
    // By the snapshot itself, and by its id and digest (what a caller holding only those
    // can check): the parent's place in its chain is known only from the snapshot.
    const attempts: [string, () => Promise<unknown>][] = [
      ["the snapshot", () => client().openSnapshot(snap)],
      ["its id and digest", () => client().openSnapshot(SNAPSHOT, { sha256: snap.sha256 })],
    ];
    for (const [how, open] of attempts) {
      const from = serve.seen.length;
      if (needsKnown && how !== "the snapshot") {
        await open();
        continue;
      }
      const e = await rejection(open());
      assert.ok(e instanceof SessionMismatchError, `${what} (${how}): ${inspect(e)}`);
      assert.equal(e.field, field, `${what} (${how})`);
      assert.equal(e.closeError, undefined);
      assert.deepEqual(closedSince(from), [newId(serve.made)], `${what} (${how}): closed again`);
    }
  }
});

test("a snapshot of another session, or taken elsewhere than the chain stands, is a mismatch", async () => {
  const cases: [string, (a: Json) => void, (e: unknown) => boolean][] = [
    ["another session's", (a) => (a.session_id = ELSEWHERE), (e) => e instanceof SessionMismatchError && e.field === "session_id"],
    ["at another call", (a) => (a.calls = 2), (e) => e instanceof SessionMismatchError && e.field === "calls"],
    ["after another record", (a) => (a.last_record_sha256 = "00".repeat(32)), (e) => e instanceof SessionMismatchError && e.field === "last_record_sha256"],
    ["of another provider", (a) => (a.provider = "runc"), (e) => e instanceof SessionMismatchError && e.field === "provider"],
    ["for another request", (a) => (a.request_id = "another"), (e) => e instanceof MayHaveRunError && e.kind === "request_id_mismatch"],
    ["with a malformed digest", (a) => (a.sha256 = "A".repeat(64)), (e) => e instanceof MayHaveRunError && e.kind === "bad_response"],
    ["with a malformed id", (a) => (a.snapshot_id = "snp_x"), (e) => e instanceof MayHaveRunError && e.kind === "bad_response"],
  ];
  for (const [what, alter, check] of cases) {
    const p = await parent();
    serve.alterSnapshot = alter;
    const e = await rejection(p.snapshot());
    assert.ok(check(e), `${what}: ${inspect(e)}`);
    assert.equal(notDispatchedReason(e), undefined, what);
  }
});

test("refusals of snapshots and forks are typed, and believed only with the request id echoed", async () => {
  const p = await parent();
  const cases: [number, string, string][] = [
    [404, "snapshot_not_found", "request"],
    [422, "unsupported", "unsupported"],
    [429, "capacity", "capacity"],
  ];
  for (const [status, code, reason] of cases) {
    for (const attempt of [() => p.snapshot(), () => p.fork(2), () => client().openSnapshot(SNAPSHOT)]) {
      serve.refuse = { status, code, reason, echo: true };
      const e = await rejection(attempt());
      assert.ok(e instanceof NotDispatchedError, inspect(e));
      assert.deepEqual([e.code, e.status, e.reason, e.source], [code, status, reason, "daemon"]);
      serve.refuse = { status, code, reason, echo: false };
      const u = await rejection(attempt());
      assert.ok(u instanceof MayHaveRunError && u.kind === "unverified_refusal" && u.claimedCode === code, inspect(u));
      assert.equal(notDispatchedReason(u), undefined);
    }
  }
});

test("malformed snapshot ids, digests and counts are refused here, nothing sent", async () => {
  const p = await parent();
  const snap = await p.snapshot();
  const from = serve.seen.length;
  const attempts: [string, () => Promise<unknown>, RegExp][] = [
    ["a session id for a snapshot's", () => client().openSnapshot(PARENT), /not a snapshot id/],
    ["an id with a path in it", () => client().deleteSnapshot(`snp_${INSTANCE}_../../x`), /not a snapshot id/],
    ["an upper-case digest", () => client().openSnapshot(SNAPSHOT, { sha256: "A".repeat(64) }), /64 lowercase hex/],
    ["a digest not the snapshot's", () => client().openSnapshot(snap, { sha256: "0".repeat(64) }), /not the digest of the snapshot given/],
    ["an unknown option", () => client().openSnapshot(SNAPSHOT, { sha: "x" } as never), /unknown member `sha`/],
    ["a tier that is none", () => client().openSnapshot(SNAPSHOT, { minimum_isolation: "strong" as never }), /minimum_isolation/],
    ["a count of 0", () => p.fork(0), /count must be a whole number greater than 0/],
    ["a fractional count", () => p.fork(2.5), /count must be a whole number/],
    ["a count over u32", () => p.fork(2 ** 32), /at most 4294967295/],
  ];
  for (const [what, attempt, says] of attempts) {
    const e = await rejection(attempt());
    assert.ok(e instanceof NotDispatchedError, `${what}: ${inspect(e)}`);
    assert.deepEqual([e.reason, e.source], ["request", "client"], what);
    assert.match(e.message, says, what);
    assert.match(e.message, /nothing was sent/, what);
  }
  assert.deepEqual(serve.seen.slice(from), [], "the client sent something");
});

// ---------------------------------------------------------------------------------------
// Across a daemon restart: the session restored under its own id.

/** A session after one call, and a copy forked from it after one call of its own. */
async function freshAndCopy(): Promise<[string, Session][]> {
  const p = await parent();
  const copy = (await p.fork(1)).sessions[0]!;
  await copy.cell("print(x + 1)");
  return [
    ["a session opened fresh", p],
    ["a forked copy", copy],
  ];
}

test("a session restored under its own id by a daemon restart goes on: its origin, tier and evidence change at the call after its last one", async () => {
  for (const [what, s] of await freshAndCopy()) {
    const before = structuredClone(s.info);
    const last = await s.cell("print(1)");
    const evidence = "7f".repeat(32);
    const o = restart(s.id, { isolation: "container", evidence });
    assert.deepEqual([o.parent_calls, o.parent_record_sha256], [last.record.session!.sequence, last.record.record_sha256], what);
    const first = await s.cell("print(x + 1)");
    assert.deepEqual(
      first.record.session,
      { session_id: s.id, sequence: o.parent_calls + 1, previous_record_sha256: last.record.record_sha256, origin: o },
      what,
    );
    assert.deepEqual([first.isolation, first.record.evidence_sha256], ["container", evidence], what);
    assert.deepEqual([s.info.origin, s.info.isolation, s.info.evidence_sha256, s.info.calls], [o, "container", evidence, o.parent_calls + 1], what);
    // What does not change across a restart stays the session's.
    assert.deepEqual([s.info.provider, s.info.environment, s.info.minimum_isolation], [before.provider, before.environment, before.minimum_isolation], what);
    // The next call carries the same origin; the daemon shows it so.
    const next = await s.cell("print(x + 1)");
    assert.deepEqual(next.record.session, { session_id: s.id, sequence: o.parent_calls + 2, previous_record_sha256: first.record.record_sha256, origin: o }, what);
    assert.deepEqual((await s.refresh()).origin, o, what);
    // A second restart is a second boundary, taken the same way.
    const again = restart(s.id);
    assert.equal((await s.cell("print(1)")).record.session?.origin?.parent_calls, again.parent_calls, what);
    assert.deepEqual(s.info.origin, again, what);
  }
});

test("a record that says restored but is no restore boundary of this session is refused", async () => {
  // Each alters the first record after a restart (its digest recomputed): only the restore
  // of this session right after its last call, naming that call's record, is taken.
  const cases: [string, (r: Json) => void, Record<string, string>][] = [
    ["parent_calls one past the last call", (r) => (r.session.origin.parent_calls += 1), { fresh: "origin.parent_calls", copy: "origin.parent_calls" }],
    ["parent_calls one before the last call", (r) => (r.session.origin.parent_calls -= 1), { fresh: "origin.parent_calls", copy: "origin.parent_calls" }],
    ["another session restored", (r) => (r.session.origin.parent_session_id = ELSEWHERE), { fresh: "origin", copy: "origin.start" }],
    ["forked, not restored", (r) => (r.session.origin.start = "forked"), { fresh: "origin", copy: "origin.snapshot_sha256" }],
    ["another record than the last", (r) => (r.session.origin.parent_record_sha256 = "00".repeat(32)), { fresh: "origin.parent_record_sha256", copy: "origin.parent_record_sha256" }],
    ["no record named", (r) => delete r.session.origin.parent_record_sha256, { fresh: "origin.parent_record_sha256", copy: "origin.parent_record_sha256" }],
    // The new tier or evidence without the restore that allows it.
    ["a new evidence, no origin", (r) => delete r.session.origin, { fresh: "evidence_sha256", copy: "origin" }],
  ];
  for (const [how, alter, fields] of cases) {
    const [fresh, copy] = (await freshAndCopy()).map(([, s]) => s);
    for (const [which, s] of [
      ["fresh", fresh!],
      ["copy", copy!],
    ] as const) {
      const what = `${how} (${which})`;
      const held = structuredClone(s.info);
      restart(s.id, { evidence: "7f".repeat(32) });
      serve.alterRecord = alter;
      const e = await rejection(s.cell("print(x + 1)"));
      serve.alterRecord = undefined;
      assert.ok(e instanceof SessionMismatchError, `${what}: ${inspect(e)}`);
      assert.equal(e.field, fields[which], `${what}: ${e.message}`);
      assert.equal(notDispatchedReason(e), undefined, what);
      // Nothing of the refused record was taken.
      assert.deepEqual([s.info.origin, s.info.evidence_sha256, s.info.calls], [held.origin, held.evidence_sha256, held.calls], what);
      const doubt = await rejection(s.cell("print(1)"));
      assert.ok(doubt instanceof NotDispatchedError && doubt.code === "chain_in_doubt", `${what}: ${inspect(doubt)}`);
    }
  }
});

test("after a restore, a record whose origin reverts, or moves again but at no boundary, is refused", async () => {
  const cases: [string, (r: Json, before: SessionOrigin | undefined) => void, Record<string, string>][] = [
    [
      "reverts to the origin before the restart",
      (r, before) => {
        if (before === undefined) delete r.session.origin;
        else r.session.origin = before;
      },
      { fresh: "origin", copy: "origin.start" },
    ],
    ["the restore's origin, but at this call", (r) => (r.session.origin.parent_calls = r.session.sequence - 1), { fresh: "origin.parent_record_sha256", copy: "origin.parent_record_sha256" }],
    ["another snapshot of the restore", (r) => (r.session.origin.snapshot_sha256 = "00".repeat(32)), { fresh: "origin.parent_calls", copy: "origin.parent_calls" }],
  ];
  for (const [how, alter, fields] of cases) {
    const [fresh, copy] = (await freshAndCopy()).map(([, s]) => s);
    for (const [which, s] of [
      ["fresh", fresh!],
      ["copy", copy!],
    ] as const) {
      const what = `${how} (${which})`;
      const before = s.info.origin;
      const o = restart(s.id);
      await s.cell("print(x + 1)");
      assert.deepEqual(s.info.origin, o, what);
      serve.alterRecord = (r) => alter(r, before);
      const e = await rejection(s.cell("print(x + 1)"));
      serve.alterRecord = undefined;
      assert.ok(e instanceof SessionMismatchError, `${what}: ${inspect(e)}`);
      assert.equal(e.field, fields[which], `${what}: ${e.message}`);
      assert.deepEqual(s.info.origin, o, what);
    }
  }
});

test("a resync or refresh takes a restore of this session the daemon shows, and nothing else", async () => {
  // Shown before its next call: refresh shows it, the chain stays where it was verified, and
  // the next call crosses the restore itself.
  for (const [what, s] of await freshAndCopy()) {
    const o = restart(s.id, { isolation: "vm", evidence: "7f".repeat(32) });
    const shownInfo = await s.refresh();
    assert.deepEqual([shownInfo.origin, shownInfo.isolation], [o, "vm"], what);
    assert.equal((await s.cell("print(1)")).record.session?.origin?.parent_calls, o.parent_calls, what);
  }
  // In doubt across the restart (a call unverified before it, or the first after it): the
  // daemon's word taken, its origin, tier and evidence too.
  for (const doubtFirst of [true, false]) {
    for (const [what, s] of await freshAndCopy()) {
      const unverified = async (): Promise<void> => {
        serve.alterRecord = (r) => (r.session.sequence += 1);
        await rejection(s.cell("print(1)"));
        serve.alterRecord = undefined;
      };
      if (doubtFirst) await unverified();
      const o = restart(s.id, { isolation: "vm", evidence: "7f".repeat(32) });
      if (!doubtFirst) await unverified();
      const info = await s.resync();
      assert.deepEqual([info.origin, info.isolation, info.evidence_sha256, s.info.origin], [o, "vm", "7f".repeat(32), o], what);
      const next = await s.cell("print(1)");
      assert.deepEqual([next.record.session?.origin, next.record.session?.sequence, next.isolation], [o, info.calls + 1, "vm"], what);
    }
  }
  // What is refused: a restore of another session, a fork, a restore before calls this
  // client saw, a chain standing before its restore, a tier below the floor, and a new tier
  // or evidence without a restore.
  const refused: [string, (info: Json) => void, (e: unknown) => boolean][] = [
    ["another session's restore", (i) => (i.origin.parent_session_id = ELSEWHERE), (e) => e instanceof SessionLookupError && /origin/.test(e.message)],
    ["forked, not restored", (i) => (i.origin.start = "forked"), (e) => e instanceof SessionLookupError && /origin/.test(e.message)],
    ["restored before the last call seen", (i) => (i.origin.parent_calls -= 1), (e) => e instanceof SessionLookupError && /origin/.test(e.message)],
    [
      "a chain standing before its restore",
      (i) => {
        i.calls = i.origin.parent_calls - 1;
        i.last_record_sha256 = "00".repeat(32);
      },
      (e) => e instanceof SessionLookupError && /a chain cannot stand so/.test(e.message),
    ],
    ["a tier below the floor", (i) => (i.isolation = "process"), (e) => e instanceof EvidenceMismatchError && e.floor === "container"],
    [
      "a new evidence, no restore",
      (i) => {
        delete i.origin;
        i.evidence_sha256 = "7f".repeat(32);
      },
      (e) => e instanceof SessionLookupError && /evidence_sha256/.test(e.message),
    ],
    [
      "a new tier, no restore",
      (i) => {
        delete i.origin;
        i.isolation = "vm";
      },
      (e) => e instanceof SessionLookupError && /isolation/.test(e.message),
    ],
  ];
  for (const [how, alter, check] of refused) {
    const p = await parent();
    await p.cell("print(1)");
    restart(p.id);
    serve.alterShown = alter;
    for (const [which, look] of [
      ["resync", () => p.resync()],
      ["refresh", () => p.refresh()],
    ] as const) {
      const e = await rejection(look());
      assert.ok(check(e), `${how} (${which}): ${inspect(e)}`);
    }
    serve.alterShown = undefined;
    assert.equal(p.info.origin, undefined, how);
  }
});
