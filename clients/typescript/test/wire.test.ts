/**
 * The reader, the bytes forms, canonical JSON and the checks on a result, without a daemon:
 * the cases a real daemon never sends but a party in the middle could.
 * @module
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  type Floor,
  JsonSyntaxError,
  MayHaveRunError,
  type RunRecord,
  type RunRequest,
  type RunResponse,
  type RunResult,
  type Tier,
  ShapeError,
  TIERS,
  bytesToWire,
  canonicalJson,
  decodeBase64,
  decodeRunRecord,
  decodeRunRequest,
  decodeRunResult,
  decodeSessionInfo,
  decodeStreamLine,
  DigestMismatchError,
  EvidenceMismatchError,
  notDispatchedReason,
  ProviderMismatchError,
  RecordMismatchError,
  recordSha256,
  requestSha256,
  resultSha256,
  text,
  tierRank,
  verifyResponse,
} from "@plimsoll/client";

const minimalResult = {
  exit_code: 0,
  timed_out: false,
  stdout: "1\n",
  stdout_truncated: false,
  stderr: "",
  stderr_truncated: false,
};

function resultJson(extra: Record<string, unknown> = {}): string {
  return JSON.stringify({ ...minimalResult, ...extra });
}

test("duplicate member names are refused, not silently resolved", () => {
  const json = '{"exit_code":0,"exit_code":1,"timed_out":false,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false}';
  assert.throws(() => decodeRunResult(json), (e) => e instanceof JsonSyntaxError && /duplicate member `exit_code`/.test(e.message));
});

test("a lone surrogate escape is refused; an escaped pair is one character", () => {
  assert.throws(() => decodeRunResult(resultJson().replace('"1\\n"', '"\\ud800"')), JsonSyntaxError);
  assert.throws(() => decodeRunResult(resultJson().replace('"1\\n"', '"\\udc00x"')), JsonSyntaxError);
  const r = decodeRunResult(resultJson().replace('"1\\n"', '"\\ud83d\\ude00"'));
  assert.deepEqual([...r.stdout], [0xf0, 0x9f, 0x98, 0x80]);
});

test("invalid UTF-8 in a body is refused", () => {
  const bytes = new TextEncoder().encode(resultJson());
  const at = bytes.indexOf(0x31); // the "1" of stdout
  bytes[at] = 0xff;
  assert.throws(() => decodeRunResult(bytes), (e) => e instanceof JsonSyntaxError && /UTF-8/.test(e.message));
});

test("integers must be integers, in range, and exactly representable", () => {
  for (const bad of ["1.0", "1e2", "-0.5", "2147483648", '"0"', "true"]) {
    assert.throws(() => decodeRunResult(resultJson().replace('"exit_code":0', `"exit_code":${bad}`)), ShapeError, bad);
  }
  assert.equal(decodeRunResult(resultJson({ exit_code: -2147483648 })).exit_code, -2147483648);
  const big = resultJson({ artifacts: [{ path: "a", found: true, size: 1, content: "", truncated: true }] });
  assert.throws(() => decodeRunResult(big.replace('"size":1', '"size":9007199254740993')), /2\^53/);
  assert.throws(() => decodeRunResult(big.replace('"size":1', '"size":18446744073709551616')), /out of range/);
  assert.throws(() => decodeRunResult(big.replace('"size":1', '"size":01')), JsonSyntaxError);
});

test("unknown members are refused, missing required ones too", () => {
  assert.throws(() => decodeRunResult(resultJson({ extra: 1 })), /unknown member `extra`/);
  const { timed_out: _, ...without } = minimalResult;
  assert.throws(() => decodeRunResult(JSON.stringify(without)), /result\.timed_out: missing/);
  assert.throws(() => decodeRunResult(resultJson({ timed_out: null })), /result\.timed_out: missing/);
});

test("null reads exactly as an absent member, in meaning and in the digest", () => {
  const plain = decodeRunResult(resultJson());
  const nulls = decodeRunResult(resultJson({ signal: null, oom_killed: null, steps: null, artifacts: null, calls: null }));
  assert.deepEqual(nulls, plain);
  assert.equal(resultSha256(nulls), resultSha256(plain));
  // exit_code is nullable: null and absent are both "no exit code".
  const { exit_code: _, ...noExit } = minimalResult;
  assert.equal(decodeRunResult(JSON.stringify(noExit)).exit_code, null);
  assert.equal(decodeRunResult(resultJson({ exit_code: null })).exit_code, null);
  assert.notEqual(resultSha256(decodeRunResult(resultJson({ exit_code: null }))), resultSha256(plain));
});

test("bytes: a string and its base64 are the same bytes, base64 is strict", () => {
  const s = decodeRunResult(resultJson({ stdout: "héllo\n" }));
  const b = decodeRunResult(resultJson({ stdout: { base64: "aMOpbGxvCg==" } }));
  assert.deepEqual(b.stdout, s.stdout);
  assert.equal(resultSha256(b), resultSha256(s));
  for (const bad of ["aMOpbGxvCg=", "aMOpbGxvCg", "aMOp bGxvCg==", "aMOpbGxvCg==\n", "aR==", "a-_b", "===="]) {
    assert.equal(decodeBase64(bad), undefined, bad);
    assert.throws(() => decodeRunResult(resultJson({ stdout: { base64: bad } })), ShapeError, bad);
  }
  assert.deepEqual(decodeBase64("aQ=="), Uint8Array.of(0x69));
  assert.deepEqual(decodeBase64(""), new Uint8Array(0));
  assert.throws(() => decodeRunResult(resultJson({ stdout: { base64: "", hex: "" } })), /unknown member `hex`/);
  assert.throws(() => decodeRunResult(resultJson({ stdout: {} })), /missing/);
});

test("bytes go out as text when they are UTF-8 (a byte order mark kept), base64 otherwise", () => {
  assert.equal(bytesToWire(new TextEncoder().encode("plain")), "plain");
  assert.equal(bytesToWire(Uint8Array.of(0xef, 0xbb, 0xbf, 0x41)), "\ufeffA");
  assert.deepEqual(bytesToWire(Uint8Array.of(0xff, 0x00)), { base64: "/wA=" });
  assert.equal(text(Uint8Array.of(0xef, 0xbb, 0xbf, 0x41)), "\ufeffA");
  assert.equal(text(Uint8Array.of(0x41, 0xff)), "A\ufffd");
  assert.throws(() => text(Uint8Array.of(0x41, 0xff), { fatal: true }), TypeError);
});

test("canonical JSON sorts names by code point and escapes minimally", () => {
  // JavaScript's default sort compares UTF-16 units and would put U+1F600 first.
  assert.equal(canonicalJson({ "\u{1F600}": 1, "\uFF61": 2, b: [true, null], a: "x" }), '{"a":"x","b":[true,null],"\uFF61":2,"\u{1F600}":1}');
  assert.equal(canonicalJson({ s: '"\\\b\f\n\r\t\u0001\u001f\u007f/é' }), '{"s":"\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\u007f/é"}');
  assert.equal(canonicalJson({ gone: undefined, none: null, kept: 0 }), '{"kept":0}');
});

test("a request reads back with its defaults, and its id is not in its digest", () => {
  const r = decodeRunRequest(
    JSON.stringify({ protocol: 1, request_id: "a", run: { kind: "project", steps: [{ run: "true" }], files: [{ path: "f", content: "x" }] } }),
  );
  assert.deepEqual(r.run, { kind: "project", files: [{ path: "f", content: new TextEncoder().encode("x"), executable: false }], steps: [{ run: "true" }], artifacts: [] });
  assert.equal(requestSha256(r), requestSha256({ ...r, request_id: "b" }));
  assert.throws(() => decodeRunRequest('{"protocol":1,"request_id":"a","run":{"kind":"snippet","language":"js","code":"1"}}'), /not a language/);
  assert.throws(() => decodeRunRequest('{"protocol":1,"request_id":"a","run":{"kind":"snippet","language":"python","code":"1","steps":[]}}'), /unknown member `steps`/);
});

// ---------------------------------------------------------------------------------------
// The checks on a result (as crates/client/src/verify.rs makes them).

function request(floor?: RunRequest["minimum_isolation"], provider?: string): RunRequest {
  const r: RunRequest = { protocol: 1, request_id: "r-1", run: { kind: "snippet", language: "javascript", code: "console.log(1)" } };
  if (floor !== undefined) r.minimum_isolation = floor;
  if (provider !== undefined) r.provider = provider;
  return r;
}

/** A response whose digests and record are all consistent with `req`. */
function honest(
  req: RunRequest,
  isolation: RunResponse["isolation"],
  provider = "p",
  /** The record's applied floor; `null` leaves it out. */
  applied: Tier | null = req.minimum_isolation ?? "process",
): RunResponse {
  const result: RunResult = { ...decodeRunResult(resultJson()) };
  const record: RunRecord = {
    request_id: req.request_id,
    request_sha256: requestSha256(req),
    result_sha256: resultSha256(result),
    provider,
    isolation,
    ...(applied === null ? {} : { minimum_isolation: applied }),
    evidence_sha256: "e".repeat(64),
    environment: "test",
    started_unix_ms: 1,
    ended_unix_ms: 2,
    trials: [],
    record_sha256: "",
  };
  record.record_sha256 = recordSha256(record);
  return {
    protocol: 1,
    request_id: req.request_id,
    provider,
    isolation,
    duration_ms: 1,
    request_sha256: record.request_sha256,
    result_sha256: record.result_sha256,
    result,
    record,
  };
}

const floorOf = (req: RunRequest): Floor | undefined =>
  req.minimum_isolation === undefined ? undefined : { tier: req.minimum_isolation, source: "request" };

test("an honest response verifies at or above its floor, and fails below it", () => {
  for (const floor of TIERS) {
    for (const tier of TIERS) {
      const req = request(floor);
      const run = (): RunResponse => verifyResponse(req, honest(req, tier), floorOf(req));
      if (tierRank(tier) >= tierRank(floor)) {
        run();
      } else {
        // Every digest matches and the record agrees: only the tier check catches it.
        assert.throws(run, (e) => e instanceof EvidenceMismatchError && e.isolation === tier && e.floor === floor);
      }
    }
  }
  const req = request();
  verifyResponse(req, honest(req, "process"), undefined);
  assert.throws(
    () => verifyResponse(req, honest(req, "process"), { tier: "container", source: "daemon_default" }),
    (e) => e instanceof EvidenceMismatchError && e.floorSource === "daemon_default" && /daemon's default floor/.test(e.message),
  );
});

test("a record below the floor is caught even if the response is not", () => {
  const req = request("container");
  const resp = honest(req, "container");
  resp.record.isolation = "process";
  assert.throws(() => verifyResponse(req, resp, floorOf(req)), EvidenceMismatchError);
});

test("each digest is recomputed, and says which", () => {
  const req = request();
  const changed = honest(req, "process");
  changed.result.stdout = new TextEncoder().encode("2\n");
  assert.throws(() => verifyResponse(req, changed, undefined), (e) => e instanceof DigestMismatchError && e.digest === "result");
  // The request digest is over what this client sent, not what the daemon claims.
  const other = request("process");
  assert.throws(
    () => verifyResponse(req, honest(other, "process"), undefined),
    (e) => e instanceof DigestMismatchError && e.digest === "request" && e.message.includes(e.computed) && e.message.includes(e.claimed),
  );
  const moved = honest(req, "process");
  moved.record.environment = "elsewhere";
  assert.throws(() => verifyResponse(req, moved, undefined), (e) => e instanceof DigestMismatchError && e.digest === "record");
});

test("the record must agree with the response", () => {
  const req = request();
  const up = honest(req, "process");
  up.isolation = "vm";
  assert.throws(() => verifyResponse(req, up, undefined), (e) => e instanceof RecordMismatchError && e.field === "isolation");
  const elsewhere = honest(req, "process");
  elsewhere.provider = "q";
  assert.throws(() => verifyResponse(req, elsewhere, undefined), (e) => e instanceof RecordMismatchError && e.field === "provider");
});

test("another request's result is not ours, and another protocol is not read", () => {
  const req = request();
  const e = (() => {
    try {
      verifyResponse(req, honest({ ...req, request_id: "r-2" }, "process"), undefined);
    } catch (x) {
      return x;
    }
    return undefined;
  })();
  assert.ok(e instanceof MayHaveRunError && e.kind === "request_id_mismatch" && e.echoedRequestId === "r-2");
  assert.equal(notDispatchedReason(e), undefined);
  const future = honest(req, "process");
  future.protocol = 2;
  assert.throws(() => verifyResponse(req, future, undefined), (x) => x instanceof MayHaveRunError && x.kind === "bad_response");
});

test("another provider than the one named is a provider mismatch, in the response or the record", () => {
  const req = request(undefined, "p");
  verifyResponse(req, honest(req, "process", "p"), undefined);
  // Consistent everywhere (digests, record), but not the provider asked for.
  const asked = request(undefined, "q");
  assert.throws(
    () => verifyResponse(asked, honest(asked, "process", "p"), undefined),
    (e) => e instanceof ProviderMismatchError && e.asked === "q" && e.provider === "p" && e.code === "evidence_mismatch" && /the code ran/.test(e.message),
  );
  const resp = honest(req, "process", "p");
  resp.record.provider = "r";
  resp.record.record_sha256 = recordSha256(resp.record);
  assert.throws(() => verifyResponse(req, resp, undefined), (e) => e instanceof ProviderMismatchError && e.provider === "r");
});

test("the record's applied floor must be there, meet the tier and be the floor sent or the default", () => {
  // Absent: a daemon older than this client, or one that hides the floor it applied.
  const req = request("process");
  const absent = honest(req, "process", "p", null);
  assert.throws(
    () => verifyResponse(req, absent, floorOf(req)),
    (e) => e instanceof MayHaveRunError && e.kind === "bad_response" && /minimum_isolation/.test(e.message) && notDispatchedReason(e) === undefined,
  );
  // Lowered below the floor sent, the record digest recomputed: the tier still meets it.
  const sent = request("container");
  const lowered = honest(sent, "container", "p", "process");
  assert.throws(
    () => verifyResponse(sent, lowered, floorOf(sent)),
    (e) =>
      e instanceof RecordMismatchError &&
      e.field === "minimum_isolation" &&
      e.response === "container" &&
      e.record === "process" &&
      /the floor sent/.test(e.message),
  );
  // Raised above the tier that ran: a run below the floor the daemon says it applied.
  const raised = honest(req, "process", "p", "kernel");
  assert.throws(
    () => verifyResponse(req, raised, floorOf(req)),
    (e) => e instanceof EvidenceMismatchError && e.floor === "kernel" && e.floorSource === "record" && /record says/.test(e.message),
  );
  // None sent: it must be the daemon's default floor the client learnt.
  const none = request();
  const fromDefault: Floor = { tier: "container", source: "daemon_default" };
  verifyResponse(none, honest(none, "container", "p", "container"), fromDefault);
  assert.throws(
    () => verifyResponse(none, honest(none, "container", "p", "process"), fromDefault),
    (e) => e instanceof RecordMismatchError && e.field === "minimum_isolation" && e.response === "container" && /default floor/.test(e.message),
  );
});

test("a record's applied floor is read, null as absent, and is covered by its digest", () => {
  const base = honest(request("container"), "container").record;
  const json = (over: Record<string, unknown>): string => JSON.stringify({ ...base, ...over });
  assert.equal(decodeRunRecord(json({})).minimum_isolation, "container");
  assert.equal(decodeRunRecord(json({ minimum_isolation: null })).minimum_isolation, undefined);
  assert.equal("minimum_isolation" in decodeRunRecord(json({ minimum_isolation: null })), false);
  assert.throws(() => decodeRunRecord(json({ minimum_isolation: "strong" })), /not a tier/);
  assert.throws(() => decodeRunRecord(json({ isolation: null })), /missing/);
  assert.notEqual(recordSha256({ ...base, minimum_isolation: "process" }), recordSha256(base));
  const { minimum_isolation: _, ...older } = base;
  assert.equal(recordSha256(decodeRunRecord(json({ minimum_isolation: null }))), recordSha256(older));
});

test("a result's start is read, null as absent, and covered by its digest with a warm member's age", () => {
  const cold = decodeRunResult(resultJson({ start: "cold" }));
  assert.equal(cold.start, "cold");
  assert.equal("member_age_ms" in cold, false);
  const warm = decodeRunResult(resultJson({ start: "warm", member_age_ms: 1500 }));
  assert.deepEqual([warm.start, warm.member_age_ms], ["warm", 1500]);
  const older = decodeRunResult(resultJson({ start: null, member_age_ms: null }));
  assert.equal("start" in older || "member_age_ms" in older, false);
  assert.equal(resultSha256(older), resultSha256(decodeRunResult(resultJson())));
  assert.notEqual(resultSha256(cold), resultSha256(older));
  assert.notEqual(resultSha256(warm), resultSha256({ ...warm, member_age_ms: 1501 }));
  assert.throws(() => decodeRunResult(resultJson({ start: "hot" })), /not a start/);
});

test("a call's credential kind is read, null as absent, and covered by the result digest", () => {
  const call = (credential?: unknown) => ({
    method: "GET",
    request_bytes: 0,
    response_bytes: 2,
    latency_ms: 1,
    ...(credential === undefined ? {} : { credential }),
  });
  const withKind = (credential?: unknown) => decodeRunResult(resultJson({ calls: [call(credential)] }));
  assert.equal(withKind("static").calls[0]?.credential, "static");
  assert.equal(withKind("minted").calls[0]?.credential, "minted");
  assert.equal("credential" in (withKind(null).calls[0] ?? {}), false);
  assert.equal(resultSha256(withKind(null)), resultSha256(withKind()));
  assert.notEqual(resultSha256(withKind("static")), resultSha256(withKind()));
  assert.notEqual(resultSha256(withKind("static")), resultSha256(withKind("minted")));
  assert.throws(() => withKind("borrowed"), /not a credential kind/);
});

test("a result's wall is read strictly, null as absent, and covered by its digest", () => {
  const wall = {
    uid: 2000100,
    euid: 2000100,
    gid: 2000100,
    cap_eff: "0000000000000000",
    no_new_privs: true,
    seccomp: 2,
    namespaces: [{ name: "net", id: "net:[4026532302]", same_as_host: false }],
    root_read_only: true,
    network_interfaces: ["lo"],
    memory_limit_bytes: 268435456,
  };
  const r = decodeRunResult(resultJson({ start: "cold", wall }));
  assert.deepEqual([r.wall?.uid, r.wall?.seccomp, r.wall?.groups, r.wall?.namespaces[0]?.same_as_host], [2000100, 2, [], false]);
  assert.equal(r.wall !== undefined && "cap_amb" in r.wall, false);
  const nulls = decodeRunResult(resultJson({ start: "cold", wall: { ...wall, cap_amb: null, pids_limit: null, groups: null } }));
  assert.equal(resultSha256(nulls), resultSha256(r));
  assert.notEqual(resultSha256(r), resultSha256(decodeRunResult(resultJson({ start: "cold" }))));
  assert.notEqual(resultSha256(r), resultSha256(decodeRunResult(resultJson({ start: "cold", wall: { ...wall, uid: 0 } }))));
  const { root_read_only: _, ...noRoot } = wall;
  for (const [bad, says] of [
    [{ ...wall, extra: 1 }, /unknown member `extra`/],
    [noRoot, /root_read_only: missing/],
    [{ ...wall, uid: 2 ** 32 }, /out of range for u32/],
    [{ ...wall, groups: [-1] }, /groups/],
    [{ ...wall, namespaces: [{ name: "net" }] }, /id: missing/],
    [{ ...wall, no_new_privs: "yes" }, /no_new_privs/],
  ] as const) {
    assert.throws(() => decodeRunResult(resultJson({ start: "cold", wall: bad })), says);
  }
});

test("a member age without a warm start, or a warm start without one, is a bad response", () => {
  const req = request();
  /** `honest`, its result holding `members`, every digest recomputed over it. */
  const with_ = (members: Partial<RunResult>): RunResponse => {
    const resp = honest(req, "process");
    resp.result = { ...resp.result, ...members };
    resp.result_sha256 = resultSha256(resp.result);
    resp.record = { ...resp.record, result_sha256: resp.result_sha256 };
    resp.record.record_sha256 = recordSha256(resp.record);
    return resp;
  };
  for (const ok of [{ start: "warm", member_age_ms: 1500 }, { start: "cold" }] as const) {
    const resp = verifyResponse(req, with_(ok), undefined);
    assert.deepEqual([resp.result.start, resp.result.member_age_ms], [ok.start, "member_age_ms" in ok ? ok.member_age_ms : undefined]);
  }
  for (const [bad, says] of [
    [{ member_age_ms: 1500 }, "`start` is absent"],
    [{ start: "cold", member_age_ms: 1500 }, '`start` is "cold"'],
    [{ start: "warm" }, "`member_age_ms` is absent"],
  ] as const) {
    assert.throws(
      () => verifyResponse(req, with_(bad), undefined),
      (e) => e instanceof MayHaveRunError && e.kind === "bad_response" && /malformed/.test(e.message) && e.message.includes(says),
    );
  }
});

test("a cell's state_kept and interpreter_end are read strictly, null as absent, and digested", () => {
  const kept = decodeRunResult(resultJson({ state_kept: true }));
  assert.equal(kept.state_kept, true);
  assert.equal("interpreter_end" in kept, false);
  const ended = decodeRunResult(resultJson({ state_kept: false, interpreter_end: "cell_timeout" }));
  assert.deepEqual([ended.state_kept, ended.interpreter_end], [false, "cell_timeout"]);
  const plain = decodeRunResult(resultJson());
  const nulls = decodeRunResult(resultJson({ state_kept: null, interpreter_end: null }));
  assert.equal("state_kept" in nulls || "interpreter_end" in nulls, false);
  // Absent adds nothing: a result outside sessions keeps its digest.
  assert.equal(resultSha256(nulls), resultSha256(plain));
  assert.notEqual(resultSha256(kept), resultSha256(plain));
  assert.notEqual(resultSha256(kept), resultSha256({ ...kept, state_kept: false }));
  assert.notEqual(resultSha256(ended), resultSha256({ ...ended, interpreter_end: "interpreter_crash" }));
  assert.throws(() => decodeRunResult(resultJson({ interpreter_end: "tired" })), /is not a session end reason/);
  assert.throws(() => decodeRunResult(resultJson({ state_kept: "yes" })), /state_kept/);
});

test("a record's session link is read strictly, null as absent, and digested as record fields", () => {
  const base = honest(request("container"), "container").record;
  const json = (over: Record<string, unknown>): string => JSON.stringify({ ...base, ...over });
  const first = decodeRunRecord(json({ session: { session_id: "ses_a", sequence: 1, previous_record_sha256: null } }));
  assert.deepEqual(first.session, { session_id: "ses_a", sequence: 1 });
  assert.equal(recordSha256(decodeRunRecord(json({ session: null }))), recordSha256(base));
  assert.notEqual(recordSha256(first), recordSha256(base));
  const second: RunRecord = { ...first, session: { session_id: "ses_a", sequence: 2, previous_record_sha256: "a".repeat(64) } };
  for (const changed of [
    { session_id: "ses_b", sequence: 2, previous_record_sha256: "a".repeat(64) },
    { session_id: "ses_a", sequence: 3, previous_record_sha256: "a".repeat(64) },
    { session_id: "ses_a", sequence: 2, previous_record_sha256: "b".repeat(64) },
    { session_id: "ses_a", sequence: 2 },
  ]) {
    assert.notEqual(recordSha256({ ...second, session: changed }), recordSha256(second));
  }
  for (const [bad, says] of [
    [{ session_id: "ses_a" }, /sequence: missing/],
    [{ session_id: "ses_a", sequence: 1, extra: 1 }, /unknown member `extra`/],
    [{ session_id: "ses_a", sequence: -1 }, /sequence/],
  ] as const) {
    assert.throws(() => decodeRunRecord(json({ session: bad })), says);
  }
});

test("a stream line is one of chunk, response or error, and a chunk is always a preview", () => {
  const chunk = decodeStreamLine('{"chunk":{"preview":true,"stream":"stderr","offset":5,"bytes":{"base64":"/wA="}}}');
  assert.ok("chunk" in chunk);
  assert.deepEqual(chunk.chunk, { preview: true, stream: "stderr", offset: 5, bytes: Uint8Array.of(0xff, 0x00) });
  const error = decodeStreamLine(
    '{"error":{"protocol":1,"request_id":"r","error":{"code":"session_ended","message":"m","not_dispatched":"request","end_reason":"closed"}}}',
  );
  assert.ok("error" in error);
  assert.equal(error.error.error.end_reason, "closed");
  for (const [bad, says] of [
    ['{"chunk":{"preview":false,"stream":"stdout","offset":0,"bytes":""}}', /always a preview/],
    ['{"chunk":{"preview":true,"stream":"stdin","offset":0,"bytes":""}}', /not a stream/],
    ['{"chunk":{"preview":true,"stream":"stdout","offset":0,"bytes":"","more":1}}', /unknown member `more`/],
    ['{"chunk":{"preview":true,"stream":"stdout","offset":0,"bytes":""},"error":null}', /exactly one/],
    ["{}", /exactly one/],
    ['{"keepalive":true}', /unknown member `keepalive`/],
  ] as const) {
    assert.throws(() => decodeStreamLine(bad), says);
  }
});

test("a session is read strictly: required members, end reasons, null as absent", () => {
  const info = {
    protocol: 1,
    request_id: "r",
    session_id: `ses_${"a".repeat(16)}_${"b".repeat(32)}`,
    language: "python",
    provider: "crun",
    isolation: "container",
    minimum_isolation: "container",
    evidence_sha256: "e".repeat(64),
    environment: "sha256:abc",
    wall: { uid: 1, euid: 1, gid: 1, root_read_only: true },
    opened_unix_ms: 1,
    expires_unix_ms: 2,
    idle_timeout_ms: 300000,
    calls: 0,
    interpreter_alive: true,
  };
  const read = decodeSessionInfo(JSON.stringify({ ...info, last_record_sha256: null, end_reason: null }));
  assert.equal("last_record_sha256" in read || "end_reason" in read, false);
  assert.equal(decodeSessionInfo(JSON.stringify({ ...info, end_reason: "idle_timeout" })).end_reason, "idle_timeout");
  const { wall: _, ...noWall } = info;
  for (const [bad, says] of [
    [{ ...info, end_reason: "bored" }, /not a session end reason/],
    [noWall, /wall: missing/],
    [{ ...info, extra: 1 }, /unknown member `extra`/],
    [{ ...info, calls: -1 }, /calls/],
  ] as const) {
    assert.throws(() => decodeSessionInfo(JSON.stringify(bad)), says);
  }
});
