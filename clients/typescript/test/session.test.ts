/**
 * Sessions through the client against a real plimsolld offering crun (docs/sessions.md):
 * state kept across cells, steps and files sharing /work, exact bytes both ways, streaming,
 * every end explicit, another caller's id unknown; and real proxies on loopback that alter a
 * call's answer or replay an earlier one, which the digests and the chain catch. Under
 * CI=true a missing daemon binary, image or runtime fails these tests instead of skipping
 * them.
 * @module
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { after, before, test, type TestContext } from "node:test";
import { inspect } from "node:util";

import {
  Client,
  DigestMismatchError,
  EvidenceMismatchError,
  MayHaveRunError,
  NotDispatchedError,
  type OutputChunk,
  ProviderMismatchError,
  type RunResponse,
  type Session,
  SessionLookupError,
  SessionMismatchError,
  decodeRunRecord,
  notDispatchedReason,
  recordSha256,
  text,
} from "@plimsoll/client";

import { LocalDaemon, missingForDaemon, missingForImage } from "./daemon.js";
import { CLIENT_DIR, strict } from "./paths.js";
import { Proxy, type Rewrite } from "./proxy.js";

/** A second caller, whose view of the first caller's sessions is tested. */
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
  // crun alone, as the daemon's own session tests run it: no warm pools holding uid slots.
  daemon = await LocalDaemon.start({ providers: ["crun"], otherCallers: [OTHER], sections: "[pools]\n" });
  const crun = (await client().providers()).providers.find((p) => p.name === "crun");
  if (crun === undefined || !crun.available) {
    setupProblem = `crun is not available here: ${crun?.unavailable_reason ?? "not listed"}`;
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

/** Opens a session, runs `f` with it, and closes it whatever happens (a session holds a slot). */
async function withSession<T>(
  language: "python" | "javascript",
  f: (s: Session) => Promise<T>,
  c: Client = client(),
): Promise<T> {
  const s = await c.openSession({ language, minimum_isolation: "container", provider: "crun" });
  try {
    return await f(s);
  } finally {
    await s.close().catch(() => undefined);
  }
}

/** A proxy altering the answers to this session's calls (`method` on a path ending `suffix`). */
function proxyFor(suffix: string, response: Rewrite, method = "POST"): Promise<Proxy> {
  return Proxy.start(daemon!.url, {
    kind: "rewrite",
    response,
    match: (m, url) => m === method && url.startsWith("/v1/sessions/") && url.split("?")[0]!.endsWith(suffix),
  });
}

// ---------------------------------------------------------------------------------------
// What a session keeps.

test("a session keeps its interpreter's state across cells, in Python and JavaScript, each call chained", async (t) => {
  if (!ready(t)) return;
  for (const [language, define, use] of [
    ["python", "n = 41\ndef twice(x):\n    return 2 * x", "n += 1\nprint(n, twice(n))"],
    ["javascript", "var n = 41; function twice(x) { return 2 * x }", "n += 1; console.log(n, twice(n))"],
  ] as const) {
    await withSession(language, async (s) => {
      assert.match(s.id, /^ses_[0-9a-f]{16}_[0-9a-f]{32}$/);
      assert.deepEqual(
        [s.info.language, s.info.provider, s.info.isolation, s.info.minimum_isolation, s.info.calls, s.info.interpreter_alive],
        [language, "crun", "container", "container", 0, true],
      );
      const first = await s.cell(define);
      assert.equal(first.result.exit_code, 0, text(first.result.stderr));
      const second = await s.cell(use);
      assert.equal(text(second.result.stdout), "42 84\n");
      assert.equal(second.result.state_kept, true);
      assert.equal(second.result.interpreter_end, undefined);
      assert.deepEqual([second.provider, second.isolation], ["crun", "container"]);
      assert.ok(second.result.wall !== undefined, "every call carries the wall read before it");
      // The chain: sequence 1, then 2 after the first call's record digest.
      assert.deepEqual(first.record.session, { session_id: s.id, sequence: 1 });
      assert.deepEqual(second.record.session, {
        session_id: s.id,
        sequence: 2,
        previous_record_sha256: first.record.record_sha256,
      });
      assert.equal(second.record.minimum_isolation, "container");
      assert.deepEqual([s.info.calls, s.info.last_record_sha256], [2, second.record.record_sha256]);
      // The daemon agrees.
      const shown = await s.refresh();
      assert.deepEqual([shown.calls, shown.last_record_sha256, shown.interpreter_alive], [2, second.record.record_sha256, true]);
      const closed = await s.close();
      assert.equal(closed.end_reason, "closed");
      assert.equal(closed.session_id, s.id);
    });
  }
});

test("a file a step writes is read by a cell, and a step's output by the next step", async (t) => {
  if (!ready(t)) return;
  await withSession("python", async (s) => {
    const steps = await s.steps(["printf 'from a step' > made.txt", { name: "count", run: "wc -c < made.txt" }]);
    assert.equal(steps.result.exit_code, 0);
    assert.deepEqual(
      steps.result.steps.map((x) => [x.name, text(x.stdout).trim()]),
      [
        [undefined, ""],
        ["count", "11"],
      ],
    );
    assert.equal(steps.result.state_kept, undefined);
    const cell = await s.cell("print(open('/work/made.txt').read())");
    assert.equal(text(cell.result.stdout), "from a step\n");
    // Files and artifacts ride a steps call too; steps stop at the first that fails.
    const more = await s.steps(["cat in.txt > out.txt", "exit 3", "echo never"], {
      files: [{ path: "in.txt", content: "given" }],
      artifacts: ["out.txt"],
    });
    assert.equal(more.result.steps.length, 2);
    assert.equal(more.result.steps[1]!.exit_code, 3);
    assert.equal(text(more.result.artifacts[0]!.content), "given");
    assert.equal(more.record.session?.sequence, 3);
  });
});

test("put and get carry exact bytes, non-UTF-8 included, and a missing file reads not found", async (t) => {
  if (!ready(t)) return;
  await withSession("python", async (s) => {
    const bytes = Uint8Array.from([0x00, 0xff, 0xfe, 0x80, 0xc3, 0x28, 0x0a, 0xef, 0xbb, 0xbf, 0x7f]);
    const put = await s.put("dir/data.bin", bytes);
    assert.equal(put.record.session?.sequence, 1);
    const got = await s.get("dir/data.bin");
    assert.deepEqual([got.found, got.size, got.truncated, got.path], [true, bytes.byteLength, false, "dir/data.bin"]);
    assert.deepEqual(got.content, bytes);
    assert.equal(got.response.record.session?.sequence, 2);
    // The interpreter sees the same bytes.
    const cell = await s.cell("import sys\nsys.stdout.buffer.write(open('/work/dir/data.bin', 'rb').read())");
    assert.deepEqual(cell.result.stdout, bytes);
    // A string is its UTF-8; a path with a space travels percent-encoded.
    await s.put("a b/été.txt", "déjà\n");
    const back = await s.get("a b/été.txt");
    assert.deepEqual([...back.content], [...new TextEncoder().encode("déjà\n")]);
    const missing = await s.get("nothing/here");
    assert.deepEqual([missing.found, missing.size, missing.content.byteLength], [false, 0, 0]);
    assert.equal(s.info.calls, 6);
  });
});

test("a streamed cell delivers its first chunk while it still runs, and its answer verifies", async (t) => {
  if (!ready(t)) return;
  await withSession("python", async (s) => {
    const chunks: { at: number; chunk: OutputChunk }[] = [];
    const res = await s.cell("import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second', flush=True)", {
      onChunk: (chunk) => chunks.push({ at: Date.now(), chunk }),
    });
    const answered = Date.now();
    assert.equal(text(res.result.stdout), "first\nsecond\n");
    assert.ok(chunks.length >= 2, inspect(chunks));
    const first = chunks[0]!;
    assert.deepEqual([first.chunk.preview, first.chunk.stream, first.chunk.offset], [true, "stdout", 0]);
    assert.equal(text(first.chunk.bytes), "first\n");
    // The first chunk came while the cell slept, not with its answer.
    assert.ok(answered - first.at >= 1000, `the first chunk came ${answered - first.at} ms before the answer`);
    // The chunks, in order, are exactly the output the verified result holds.
    const stdout = Buffer.concat(chunks.filter((c) => c.chunk.stream === "stdout").map((c) => c.chunk.bytes));
    assert.deepEqual(new Uint8Array(stdout), res.result.stdout);
    assert.equal(res.record.session?.sequence, 1);

    // Steps stream too, their offsets counting across the call's steps.
    const stepChunks: OutputChunk[] = [];
    const steps = await s.steps(["echo one", "echo two >&2; echo three"], { onChunk: (c) => stepChunks.push(c) });
    const out = stepChunks.filter((c) => c.stream === "stdout");
    assert.equal(out.map((c) => text(c.bytes)).join(""), "one\nthree\n", inspect(stepChunks));
    assert.equal(out[0]?.offset, 0);
    for (let i = 1; i < out.length; i++) {
      assert.equal(out[i]!.offset, out[i - 1]!.offset + out[i - 1]!.bytes.byteLength);
    }
    assert.equal(steps.record.session?.sequence, 2);
  });
});

// ---------------------------------------------------------------------------------------
// Ends and refusals: each says what ended and that nothing ran.

test("a call after close is refused: session_ended, end reason closed, nothing ran", async (t) => {
  if (!ready(t)) return;
  const c = client();
  const s = await c.openSession({ language: "javascript" });
  // No floor sent: the daemon's default floor (container), learnt and checked.
  assert.equal(s.info.minimum_isolation, "container");
  assert.ok((await c.listSessions()).sessions.some((x) => x.session_id === s.id));
  const closed = await s.close();
  assert.equal(closed.end_reason, "closed");
  assert.ok(!(await c.listSessions()).sessions.some((x) => x.session_id === s.id));
  const calls: [string, () => Promise<unknown>][] = [
    ["cell", () => s.cell("console.log(1)")],
    ["streamed cell", () => s.cell("console.log(1)", { onChunk: () => undefined })],
    ["steps", () => s.steps(["true"])],
    ["put", () => s.put("x", "y")],
    ["get", () => s.get("x")],
    ["close", () => s.close()],
  ];
  for (const [what, call] of calls) {
    const e = await rejection(call());
    assert.ok(e instanceof NotDispatchedError, `${what}: ${inspect(e)}`);
    assert.deepEqual([e.code, e.endReason, e.reason, e.source], ["session_ended", "closed", "request", "daemon"], what);
    // A streamed call's refusal is its stream's last line; the stream itself said 200.
    assert.equal(e.status, what === "streamed cell" ? 200 : 410, what);
    assert.equal(notDispatchedReason(e), "request");
  }
  const looked = await rejection(c.session(s.id));
  assert.ok(looked instanceof SessionLookupError, inspect(looked));
  assert.deepEqual([looked.kind, looked.code, looked.endReason, looked.status], ["refused", "session_ended", "closed", 410]);
});

test("another caller's session id is answered as an unknown one: session_not_found", async (t) => {
  if (!ready(t)) return;
  await withSession("python", async (s) => {
    const other = client(daemon!.url, daemon!.tokenOf(OTHER));
    const unknownId = `ses_${s.id.slice(4, 20)}_${"0".repeat(32)}`;
    for (const id of [s.id, unknownId]) {
      const e = await rejection(other.session(id));
      assert.ok(e instanceof SessionLookupError, inspect(e));
      assert.deepEqual([e.kind, e.code, e.status, e.reason, e.endReason], ["refused", "session_not_found", 404, "request", undefined]);
    }
    assert.ok(!(await other.listSessions()).sessions.some((x) => x.session_id === s.id));
    // A call on it made as the other caller (a proxy swaps the token in) is refused, echoing
    // its id: nothing ran.
    const proxy = await Proxy.start(daemon!.url, {
      kind: "rewrite",
      match: (_, url) => url.startsWith(`/v1/sessions/${s.id}/`),
      authorization: `Bearer ${daemon!.tokenOf(OTHER)}`,
    });
    try {
      const asOther = await client(proxy.url).session(s.id);
      for (const call of [() => asOther.cell("print(1)"), () => asOther.put("f", "x"), () => asOther.get("f")]) {
        const e = await rejection(call());
        assert.ok(e instanceof NotDispatchedError, inspect(e));
        assert.deepEqual([e.code, e.status, e.reason, e.source], ["session_not_found", 404, "request", "daemon"]);
      }
    } finally {
      await proxy.close();
    }
    // The session itself is untouched: its first call is still sequence 1.
    const mine = await s.cell("print('mine')");
    assert.equal(mine.record.session?.sequence, 1);
  });
});

test("an interpreter that ends says so; the next cell is refused until one asks for a restart", async (t) => {
  if (!ready(t)) return;
  await withSession("python", async (s) => {
    await s.cell("kept = 1");
    const crash = await s.cell("import os\nos._exit(7)");
    assert.deepEqual([crash.result.state_kept, crash.result.interpreter_end, crash.result.exit_code], [false, "interpreter_crash", 7]);
    assert.equal(s.info.interpreter_alive, false);
    const e = await rejection(s.cell("print(1)"));
    assert.ok(e instanceof NotDispatchedError, inspect(e));
    assert.deepEqual([e.code, e.status, e.reason], ["interpreter_ended", 409, "request"]);
    const fresh = await s.cell("print('kept' in globals())", { restart: true });
    assert.deepEqual([text(fresh.result.stdout), fresh.result.state_kept], ["False\n", false]);
    // The refused cell is not in the chain: the restart is the third call.
    assert.equal(fresh.record.session?.sequence, 3);
    assert.equal(s.info.interpreter_alive, true);
  });
});

test("a session below its floor is refused with nothing opened; a malformed call is refused unsent", async (t) => {
  if (!ready(t)) return;
  const c = client();
  const e = await rejection(c.openSession({ language: "python", minimum_isolation: "vm" }));
  assert.ok(e instanceof NotDispatchedError, inspect(e));
  assert.deepEqual([e.reason, e.source], ["isolation", "daemon"]);
  await withSession("python", async (s) => {
    for (const call of [
      () => s.steps([]),
      () => s.cell("  "),
      () => s.put("../escape", "x"),
      () => s.get("/etc/passwd"),
      () => s.cell("print(1)", { timeoutMs: 0 }),
    ]) {
      const r = await rejection(call());
      assert.ok(r instanceof NotDispatchedError, inspect(r));
      assert.deepEqual([r.reason, r.source], ["request", "client"]);
    }
    // None of them was sent: the first call still opens the chain.
    assert.equal((await s.cell("print(1)")).record.session?.sequence, 1);
  });
});

test("a session resumed by id goes on from where the daemon says its chain stands", async (t) => {
  if (!ready(t)) return;
  const c = client();
  await withSession(
    "python",
    async (s) => {
      await s.cell("x = 20");
      const resumed = await c.session(s.id);
      assert.deepEqual([resumed.id, resumed.info.calls], [s.id, 1]);
      const next = await resumed.cell("x += 1\nprint(x * 2)");
      assert.equal(text(next.result.stdout), "42\n");
      assert.equal(next.record.session?.sequence, 2);
      // The first handle's chain is now behind the daemon's: its next answer is two links
      // on, and reads as a call missing from its chain.
      const e = await rejection(s.cell("print(x)"));
      assert.ok(e instanceof SessionMismatchError, inspect(e));
      assert.deepEqual([e.field, e.expected, e.found], ["sequence", "2", "3"]);
      assert.equal(notDispatchedReason(e), undefined);
    },
    c,
  );
});

// ---------------------------------------------------------------------------------------
// Parties in the middle.

test("a proxy that alters a call's answer is caught: a digest, or the chain", async (t) => {
  if (!ready(t)) return;
  const cases: [string, Rewrite, (e: unknown) => void][] = [
    [
      "stdout changed",
      (v) => {
        v.result.stdout = "43\n";
      },
      (e) => assert.ok(e instanceof DigestMismatchError && e.digest === "result", inspect(e)),
    ],
    [
      "sequence changed, record digest stale",
      (v) => {
        v.record.session.sequence += 1;
      },
      (e) => assert.ok(e instanceof DigestMismatchError && e.digest === "record", inspect(e)),
    ],
    [
      "sequence changed, record digest recomputed",
      (v) => {
        v.record.session.sequence += 1;
        v.record.record_sha256 = recordSha256(decodeRunRecord(JSON.stringify(v.record)));
      },
      (e) => assert.ok(e instanceof SessionMismatchError && e.field === "sequence", inspect(e)),
    ],
    [
      "another session's id, record digest recomputed",
      (v) => {
        v.record.session.session_id = `ses_${"1".repeat(16)}_${"2".repeat(32)}`;
        v.record.record_sha256 = recordSha256(decodeRunRecord(JSON.stringify(v.record)));
      },
      (e) => assert.ok(e instanceof SessionMismatchError && e.field === "session_id", inspect(e)),
    ],
    [
      "the link removed, record digest recomputed",
      (v) => {
        delete v.record.session;
        v.record.record_sha256 = recordSha256(decodeRunRecord(JSON.stringify(v.record)));
      },
      (e) => assert.ok(e instanceof SessionMismatchError && e.field === "session", inspect(e)),
    ],
  ];
  for (const [what, rewrite, check] of cases) {
    const proxy = await proxyFor("/cells", rewrite);
    try {
      await withSession(
        "python",
        async (s) => {
          const e = await rejection(s.cell("print(6 * 7)"));
          check(e);
          assert.ok(e instanceof MayHaveRunError, what);
          assert.equal(notDispatchedReason(e), undefined, what);
          assert.equal(s.info.calls, 0, `${what}: an unverified answer does not move the chain`);
          // Where the chain stands is now unknown: nothing more is sent until a resync.
          const doubt = await rejection(s.cell("print(1)"));
          assert.ok(doubt instanceof NotDispatchedError, `${what}: ${inspect(doubt)}`);
          assert.deepEqual([doubt.code, doubt.reason, doubt.source], ["chain_in_doubt", "request", "client"]);
          const synced = await s.resync();
          assert.deepEqual([synced.calls, s.info.calls], [1, 1], what);
          // The altered call did run: the next one (unaltered) is the chain's second link.
          const put = await s.put("after.txt", "ok");
          assert.deepEqual(put.record.session?.previous_record_sha256, synced.last_record_sha256);
          assert.equal(put.record.session?.sequence, 2, what);
        },
        client(proxy.url),
      );
    } finally {
      await proxy.close();
    }
  }
});

test("an opening answer that fails a check is refused, and that session closed again", async (t) => {
  if (!ready(t)) return;
  const cases: [Rewrite, (e: unknown) => void][] = [
    [
      (v) => {
        v.minimum_isolation = "kernel";
      },
      (e) => {
        assert.ok(e instanceof EvidenceMismatchError, inspect(e));
        assert.deepEqual([e.isolation, e.floor, e.floorSource], ["container", "kernel", "session"]);
      },
    ],
    [
      (v) => {
        v.isolation = "process";
      },
      (e) => {
        assert.ok(e instanceof EvidenceMismatchError, inspect(e));
        assert.deepEqual([e.isolation, e.floor, e.floorSource], ["process", "container", "request"]);
      },
    ],
    [
      (v) => {
        v.provider = "runc";
      },
      (e) => assert.ok(e instanceof ProviderMismatchError && e.provider === "runc", inspect(e)),
    ],
  ];
  for (const [rewrite, check] of cases) {
    const proxy = await Proxy.start(daemon!.url, {
      kind: "rewrite",
      response: rewrite,
      match: (m, url) => m === "POST" && url === "/v1/sessions",
    });
    try {
      const e = await rejection(client(proxy.url).openSession({ language: "python", minimum_isolation: "container", provider: "crun" }));
      check(e);
      assert.ok(e instanceof MayHaveRunError && e.closeError === undefined, inspect(e));
      assert.equal(notDispatchedReason(e), undefined);
      assert.deepEqual((await client().listSessions()).sessions, [], "the session was closed again");
    } finally {
      await proxy.close();
    }
  }
});

test("a proxy that replays an earlier call's answer for a later one is caught", async (t) => {
  if (!ready(t)) return;
  // The same cell twice: the request digests agree, so only the ids, the record digest and
  // the chain tell the answers apart.
  let first: { record: { request_id: string } } | undefined;
  let rewriteIds = false;
  let recompute = false;
  const replay: Rewrite = (v) => {
    if (first === undefined) {
      first = structuredClone(v);
      return undefined;
    }
    const old = structuredClone(first) as { request_id: string; record: { request_id: string; record_sha256: string } };
    if (rewriteIds) {
      old.request_id = v.request_id;
      old.record.request_id = v.request_id;
      if (recompute) old.record.record_sha256 = recordSha256(decodeRunRecord(JSON.stringify(old.record)));
    }
    return old;
  };
  const checks: [boolean, boolean, (e: unknown) => void][] = [
    [false, false, (e) => assert.ok(e instanceof MayHaveRunError && e.kind === "request_id_mismatch", inspect(e))],
    [true, false, (e) => assert.ok(e instanceof DigestMismatchError && e.digest === "record", inspect(e))],
    [
      true,
      true,
      (e) => {
        assert.ok(e instanceof SessionMismatchError, inspect(e));
        assert.deepEqual([e.field, e.expected, e.found], ["sequence", "2", "1"]);
      },
    ],
  ];
  for (const [ids, digest, check] of checks) {
    first = undefined;
    rewriteIds = ids;
    recompute = digest;
    const proxy = await proxyFor("/cells", replay);
    try {
      await withSession(
        "python",
        async (s) => {
          const one: RunResponse = await s.cell("print('same')");
          assert.equal(one.record.session?.sequence, 1);
          const e = await rejection(s.cell("print('same')"));
          check(e);
          assert.equal(notDispatchedReason(e), undefined);
        },
        client(proxy.url),
      );
    } finally {
      await proxy.close();
    }
  }
});

test("a refusal of a session call whose echoed id is rewritten is not honoured", async (t) => {
  if (!ready(t)) return;
  const proxy = await proxyFor("/cells", (v) => {
    assert.equal(v.error.code, "session_ended");
    v.request_id = "another-request";
  });
  try {
    const s = await client(proxy.url).openSession({ language: "python", minimum_isolation: "container" });
    await s.close();
    const e = await rejection(s.cell("print(1)"));
    assert.ok(e instanceof MayHaveRunError && e.kind === "unverified_refusal", inspect(e));
    // The code is the check that failed here; what the answer claimed is kept apart.
    assert.deepEqual(
      [e.code, e.claimedCode, e.endReason, e.claimedReason, e.echoedRequestId],
      ["unverified_refusal", "session_ended", "closed", "request", "another-request"],
    );
    assert.equal(notDispatchedReason(e), undefined);
  } finally {
    await proxy.close();
  }
});

test("a session never shows its caller's token", async (t) => {
  if (!ready(t)) return;
  await withSession("python", async (s) => {
    for (const shown of [inspect(s, { depth: 10 }), JSON.stringify(s), String(s)]) {
      assert.ok(!shown.includes(daemon!.token), shown);
    }
    assert.match(inspect(s), /Session \{ id: "ses_/);
  });
});

test("a stream read in small pieces, keep-alive lines between, gives the same chunks and answer", async (t) => {
  if (!ready(t)) return;
  const proxy = await Proxy.start(daemon!.url, {
    kind: "dribble",
    match: (m, url) => m === "POST" && url.includes("/cells"),
    piece: 7,
  });
  try {
    await withSession(
      "javascript",
      async (s) => {
        const chunks: OutputChunk[] = [];
        const res = await s.cell("for (const w of ['héllo', 'wörld']) console.log(w)", { onChunk: (c) => chunks.push(c) });
        assert.equal(text(res.result.stdout), "héllo\nwörld\n");
        assert.equal(Buffer.concat(chunks.map((c) => c.bytes)).toString("utf8"), "héllo\nwörld\n");
        // A handler that throws ends the call's exchange: the cell ran, its answer unread.
        const e = await rejection(
          s.cell("console.log('x')", {
            onChunk: () => {
              throw new Error("handler broke");
            },
          }),
        );
        assert.ok(e instanceof MayHaveRunError && e.kind === "transport", inspect(e));
        assert.match(e.message, /handler broke/);
        assert.equal(notDispatchedReason(e), undefined);
      },
      client(proxy.url),
    );
  } finally {
    await proxy.close();
  }
});

test("the README's sessions example runs as written", async (t) => {
  if (!ready(t)) return;
  const readme = readFileSync(`${CLIENT_DIR}/README.md`, "utf8");
  const block = /## Sessions[\s\S]*?```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  assert.ok(block !== undefined, "no sessions block in README.md");
  // Inside the package directory, so `@plimsoll/client` resolves to this package.
  const script = `${CLIENT_DIR}/build/sessions-readme.mjs`;
  writeFileSync(script, block);
  const out = await new Promise<string>((resolve, reject) => {
    execFile(
      process.execPath,
      [script],
      { env: { PLIMSOLL_URL: daemon!.url, PLIMSOLL_TOKEN: daemon!.token }, timeout: 60_000 },
      (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout)),
    );
  });
  assert.equal(out, "12.57 true 2\nUint8Array(2) [ 0, 255 ]\n");
  assert.deepEqual((await client().listSessions()).sessions, [], "the example closed its session");
});
