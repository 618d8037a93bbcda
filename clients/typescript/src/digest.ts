/**
 * The digest encoding of docs/protocol.md ("The digest encoding"), written from that page:
 * frames of a u64 big-endian length and the bytes, fields as a framed name and a framed value,
 * a domain string first, absent optional fields and empty lists left out. The evidence digest
 * is SHA-256 over canonical JSON.
 * @module
 */

import { createHash } from "node:crypto";

import { utf8 } from "./bytes.js";
import {
  type EgressReceipt,
  type Evidence,
  LIMIT_NAMES,
  type Outcome,
  type RunRecord,
  type RunRequest,
  type RunResult,
  type SessionOrigin,
  type TrialStepRecord,
  type Wall,
} from "./types.js";

/** The domain strings of the three encodings. */
export const DOMAINS = {
  request: "plimsoll/run-request/v1",
  result: "plimsoll/run-result/v1",
  record: "plimsoll/run-record/v1",
} as const;

function u64be(n: number | bigint): Uint8Array {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt(n));
  return out;
}

function i64be(n: number): Uint8Array {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigInt64(0, BigInt(n));
  return out;
}

/** A number's IEEE 754 binary64 bits, big-endian (`-0` keeps its sign bit). */
function f64be(x: number): Uint8Array {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setFloat64(0, x);
  return out;
}

const FALSE = Uint8Array.of(0);
const TRUE = Uint8Array.of(1);

function boolByte(b: boolean): Uint8Array {
  return b ? TRUE : FALSE;
}

/** Collects `frame(name) ‖ frame(value)` fields (and, at top level, a framed domain first). */
class Encoder {
  private readonly parts: Uint8Array[] = [];

  frame(x: Uint8Array): this {
    this.parts.push(u64be(x.byteLength), x);
    return this;
  }

  field(name: string, value: Uint8Array): this {
    return this.frame(utf8(name)).frame(value);
  }

  /** A field left out when `value` is undefined. */
  optional<T>(name: string, value: T | undefined, encode: (v: T) => Uint8Array): this {
    return value === undefined ? this : this.field(name, encode(value));
  }

  /** A list field, left out when the list is empty. */
  list<T>(name: string, items: readonly T[], encode: (v: T) => Uint8Array): this {
    if (items.length === 0) {
      return this;
    }
    const value = new Encoder();
    value.parts.push(u64be(items.length));
    for (const item of items) {
      value.frame(encode(item));
    }
    return this.field(name, value.bytes());
  }

  bytes(): Uint8Array {
    return Buffer.concat(this.parts);
  }
}

function top(domain: string): Encoder {
  return new Encoder().frame(utf8(domain));
}

const u64 = (n: number): Uint8Array => u64be(n);

/** The request's encoding (`request_id` is not part of it). */
export function encodeRequest(r: RunRequest): Uint8Array {
  const e = top(DOMAINS.request).field("protocol", u64be(r.protocol));
  e.optional("minimum_isolation", r.minimum_isolation, utf8);
  e.optional("provider", r.provider, utf8);
  e.optional("limits", r.limits, (l) => {
    const n = new Encoder();
    for (const k of LIMIT_NAMES) {
      n.optional(k, l[k], u64);
    }
    return n.bytes();
  });
  const run = new Encoder().field("kind", utf8(r.run.kind));
  if (r.run.kind === "snippet") {
    run.field("language", utf8(r.run.language)).field("code", utf8(r.run.code));
  } else {
    run.list("files", r.run.files, (f) =>
      new Encoder()
        .field("path", utf8(f.path))
        .field("content", f.content)
        .field("executable", boolByte(f.executable))
        .bytes(),
    );
    run.list("steps", r.run.steps, (s) =>
      new Encoder().optional("name", s.name, utf8).field("run", utf8(s.run)).bytes(),
    );
    run.list("artifacts", r.run.artifacts, utf8);
  }
  e.field("run", run.bytes());
  e.optional("grant", r.grant, utf8);
  // The image named (field 7), as sent: absent, nothing, so a request naming none keeps its digest.
  e.optional("image", r.image, utf8);
  return e.bytes();
}

function outcomeFields(e: Encoder, o: Outcome): Encoder {
  return e
    .optional("exit_code", o.exit_code ?? undefined, i64be)
    .optional("signal", o.signal, i64be)
    .field("timed_out", boolByte(o.timed_out))
    .field("oom_killed", boolByte(o.oom_killed))
    .field("stdout", o.stdout)
    .field("stdout_truncated", boolByte(o.stdout_truncated))
    .field("stderr", o.stderr)
    .field("stderr_truncated", boolByte(o.stderr_truncated));
}

/** The result's encoding (durations are not part of it). */
export function encodeResult(r: RunResult): Uint8Array {
  const e = outcomeFields(top(DOMAINS.result), r);
  e.list("steps", r.steps, (s) => outcomeFields(new Encoder().optional("name", s.name, utf8), s).bytes());
  e.list("artifacts", r.artifacts, (a) =>
    new Encoder()
      .field("path", utf8(a.path))
      .field("found", boolByte(a.found))
      .field("size", u64be(a.size))
      .field("content", a.content)
      .field("truncated", boolByte(a.truncated))
      .bytes(),
  );
  e.list("calls", r.calls, (c) =>
    new Encoder()
      .field("method", utf8(c.method))
      .optional("route", c.route, utf8)
      .optional("status", c.status, u64)
      .optional("error", c.error, utf8)
      .field("request_bytes", u64be(c.request_bytes))
      .field("response_bytes", u64be(c.response_bytes))
      // Left out when absent, so a call listed before the member existed keeps its digest.
      .optional("credential", c.credential, utf8)
      .bytes(),
  );
  // How the sandbox started, and a warm member's age: left out when absent, so a result
  // written before the members existed keeps its digest.
  e.optional("start", r.start, utf8);
  e.optional("member_age_ms", r.member_age_ms, u64);
  // What the sandbox looked like before its code was handed over (field 14), likewise.
  e.optional("wall", r.wall, encodeWall);
  // A session cell's members (fields 15-16), likewise left out when absent.
  e.optional("state_kept", r.state_kept, boolByte);
  e.optional("interpreter_end", r.interpreter_end, utf8);
  // The egress receipts (field 17), every member covered, the times included: left out when
  // empty, so a result without receipts keeps its digest.
  e.list("egress", r.egress, encodeEgressReceipt);
  return e.bytes();
}

/** An egress receipt's nested encoding (docs/protocol.md, result field 17). */
function encodeEgressReceipt(g: EgressReceipt): Uint8Array {
  return new Encoder()
    .field("host", utf8(g.host))
    .field("port", u64be(g.port))
    .field("kind", utf8(g.kind))
    .optional("address", g.address, utf8)
    .optional("sni", g.sni, utf8)
    .field("bytes_up", u64be(g.bytes_up))
    .field("bytes_down", u64be(g.bytes_down))
    .field("start_ms", u64be(g.start_ms))
    .field("end_ms", u64be(g.end_ms))
    .field("verdict", utf8(g.verdict))
    .field("rule", utf8(g.rule))
    .optional("ended", g.ended, utf8)
    .bytes();
}

/** A wall's nested encoding (docs/protocol.md, result field 14). */
function encodeWall(w: Wall): Uint8Array {
  const e = new Encoder()
    .field("uid", u64be(w.uid))
    .field("euid", u64be(w.euid))
    .field("gid", u64be(w.gid));
  e.list("groups", w.groups, u64);
  e.optional("cap_inh", w.cap_inh, utf8)
    .optional("cap_prm", w.cap_prm, utf8)
    .optional("cap_eff", w.cap_eff, utf8)
    .optional("cap_bnd", w.cap_bnd, utf8)
    .optional("cap_amb", w.cap_amb, utf8)
    .optional("no_new_privs", w.no_new_privs, boolByte)
    .optional("seccomp", w.seccomp, u64);
  e.list("namespaces", w.namespaces, (n) =>
    new Encoder()
      .field("name", utf8(n.name))
      .field("id", utf8(n.id))
      .optional("same_as_host", n.same_as_host, boolByte)
      .bytes(),
  );
  e.field("root_read_only", boolByte(w.root_read_only));
  e.list("network_interfaces", w.network_interfaces, utf8);
  e.optional("memory_limit_bytes", w.memory_limit_bytes, u64).optional("pids_limit", w.pids_limit, u64);
  return e.bytes();
}

/** The record's encoding (every member but `record_sha256`). */
export function encodeRecord(r: RunRecord): Uint8Array {
  const e = top(DOMAINS.record)
    .field("request_id", utf8(r.request_id))
    .field("request_sha256", utf8(r.request_sha256))
    .field("result_sha256", utf8(r.result_sha256))
    .field("provider", utf8(r.provider))
    .field("isolation", utf8(r.isolation))
    // The applied floor, left out when absent: a record written before it existed keeps
    // its digest.
    .optional("minimum_isolation", r.minimum_isolation, utf8)
    .field("evidence_sha256", utf8(r.evidence_sha256))
    .field("environment", utf8(r.environment))
    .field("started_unix_ms", u64be(r.started_unix_ms))
    .field("ended_unix_ms", u64be(r.ended_unix_ms));
  // A session call's place in its chain (field 11): its members as fields of the record
  // itself, not nested; absent, nothing, so a record outside sessions keeps its digest.
  if (r.session !== undefined) {
    e.field("session_id", utf8(r.session.session_id))
      .field("sequence", u64be(r.session.sequence))
      .optional("previous_record_sha256", r.session.previous_record_sha256, utf8);
  }
  // The image the code ran in (field 12), nested: absent, nothing, so a record of the process
  // tier, or written before the member existed, keeps its digest.
  e.optional("image", r.image, (i) => new Encoder().field("name", utf8(i.name)).field("identity", utf8(i.identity)).bytes());
  // What each trial step's verdict said (field 13), a list of nested: left out when empty, so
  // a record of a run without trial steps keeps its digest.
  e.list("trials", r.trials, encodeTrialStep);
  // Where a restored or forked session came from (field 14), nested: absent for a session
  // opened fresh (and outside sessions), so its records keep their digests.
  e.optional("origin", r.session?.origin, encodeOrigin);
  return e.bytes();
}

/** A session origin's nested encoding (docs/protocol.md, record field 14). */
function encodeOrigin(o: SessionOrigin): Uint8Array {
  return new Encoder()
    .field("start", utf8(o.start))
    .field("snapshot_sha256", utf8(o.snapshot_sha256))
    .field("parent_session_id", utf8(o.parent_session_id))
    .optional("parent_record_sha256", o.parent_record_sha256, utf8)
    .field("parent_calls", u64be(o.parent_calls))
    .bytes();
}

/** A trial step's nested encoding (docs/protocol.md, record field 13). */
function encodeTrialStep(s: TrialStepRecord): Uint8Array {
  const simulator = new Encoder()
    .field("name", utf8(s.simulator.name))
    .field("version", utf8(s.simulator.version))
    .field("sha256", utf8(s.simulator.sha256))
    .bytes();
  const e = new Encoder().field("step", u64be(s.step)).field("simulator", simulator).field("pass", boolByte(s.pass));
  e.list("trials", s.trials, (t) =>
    new Encoder()
      .optional("scenario", t.scenario, utf8)
      .field("end", utf8(t.end))
      .optional("reason", t.reason, utf8)
      .field("ticks", u64be(t.ticks))
      .optional("score", t.score, f64be)
      .field("pass", boolByte(t.pass))
      .field("fingerprint", utf8(t.fingerprint))
      .bytes(),
  );
  return e.bytes();
}

/** SHA-256 of `bytes`, as 64 lowercase hex characters. */
export function sha256Hex(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** `request_sha256` of a request. */
export function requestSha256(r: RunRequest): string {
  return sha256Hex(encodeRequest(r));
}

/** `result_sha256` of a result. */
export function resultSha256(r: RunResult): string {
  return sha256Hex(encodeResult(r));
}

/** `record_sha256` of a record. */
export function recordSha256(r: RunRecord): string {
  return sha256Hex(encodeRecord(r));
}

// ---------------------------------------------------------------------------------------
// Canonical JSON, for the evidence digest.

/** Compares by Unicode code point, which orders like the UTF-8 bytes (not UTF-16 units). */
function byCodePoint(a: string, b: string): number {
  const x = a[Symbol.iterator]();
  const y = b[Symbol.iterator]();
  for (;;) {
    const p = x.next();
    const q = y.next();
    if (p.done === true || q.done === true) {
      return (p.done === true ? 0 : 1) - (q.done === true ? 0 : 1);
    }
    const d = (p.value.codePointAt(0) ?? 0) - (q.value.codePointAt(0) ?? 0);
    if (d !== 0) {
      return d;
    }
  }
}

const ESCAPES: Record<string, string> = {
  '"': '\\"',
  "\\": "\\\\",
  "\b": "\\b",
  "\f": "\\f",
  "\n": "\\n",
  "\r": "\\r",
  "\t": "\\t",
};

function quote(s: string): string {
  // eslint-disable-next-line no-control-regex
  return `"${s.replace(/["\\\u0000-\u001f]/g, (c) => ESCAPES[c] ?? `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`)}"`;
}

function canonical(v: unknown): string {
  if (v === null) {
    return "null";
  }
  if (typeof v === "string") {
    return quote(v);
  }
  if (typeof v === "number") {
    if (!Number.isSafeInteger(v)) {
      throw new TypeError(`canonical JSON holds integers only, not ${v}`);
    }
    return String(v);
  }
  if (typeof v === "boolean") {
    return v ? "true" : "false";
  }
  if (Array.isArray(v)) {
    return `[${v.map(canonical).join(",")}]`;
  }
  if (typeof v === "object" && v !== null) {
    const members = Object.entries(v)
      // Absent optional members are left out, never written as null.
      .filter(([, x]) => x !== undefined && x !== null)
      .sort(([a], [b]) => byCodePoint(a, b))
      .map(([k, x]) => `${quote(k)}:${canonical(x)}`);
    return `{${members.join(",")}}`;
  }
  throw new TypeError(`canonical JSON cannot hold ${typeof v}`);
}

/** The canonical JSON text of a value (docs/protocol.md, "The evidence digest"). */
export function canonicalJson(v: unknown): string {
  return canonical(v);
}

/** `evidence_sha256` of a provider's evidence. */
export function evidenceSha256(e: Evidence): string {
  return sha256Hex(utf8(canonicalJson(e)));
}
