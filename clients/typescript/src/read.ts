/**
 * Reads parsed JSON into the wire types, as strictly as the daemon's own types: unknown
 * members are refused, required members must be there, integers must be integers in range.
 * `null` is read exactly as an absent member (docs/protocol.md, "JSON conventions").
 * @module
 */

import { decodeBase64, utf8 } from "./bytes.js";
import { JsonNumber, type JsonObject, type JsonValue, parseJson } from "./json.js";
import {
  type Artifact,
  type BinaryIdentity,
  type EgressReceipt,
  END_REASONS,
  type EndReason,
  type ErrorResponse,
  type Evidence,
  type ForkAnswer,
  type GrantCall,
  type ImageInfo,
  type ImageRef,
  type Language,
  LIMIT_NAMES,
  type Limits,
  type NamespaceSeen,
  type Outcome,
  type OutputStream,
  type ProbeReport,
  type ProviderInfo,
  type ProvidersResponse,
  REASONS,
  type Reason,
  type RunRecord,
  type RunRequest,
  type RunResponse,
  type RunResult,
  type SentRunSpec,
  SESSION_STARTS,
  type SessionInfo,
  type SessionLink,
  type SessionList,
  type SessionOrigin,
  type SessionStart,
  type SimulatorEntry,
  type SnapshotInfo,
  type SnapshotList,
  STARTS,
  type Start,
  CREDENTIAL_KINDS,
  type CredentialKind,
  type StepResult,
  type StreamLine,
  TIERS,
  type Tier,
  TRIAL_ENDS,
  type TrialEnd,
  type TrialOutcome,
  type TrialStepRecord,
  type Wall,
  type WallNamespace,
} from "./types.js";

/** Why a value does not have the shape its type needs; `path` says where. */
export class ShapeError extends Error {
  constructor(
    readonly path: string,
    what: string,
  ) {
    super(`${path}: ${what}`);
    this.name = "ShapeError";
  }
}

type Members = JsonObject;

function describe(v: JsonValue): string {
  if (v === null) return "null";
  if (v instanceof Map) return "an object";
  if (Array.isArray(v)) return "a list";
  if (v instanceof JsonNumber) return `the number ${v.text}`;
  return typeof v === "string" ? "a string" : "a boolean";
}

/** The object at `path`, refusing members outside `allowed`. */
function object(v: JsonValue, path: string, allowed: readonly string[]): Members {
  if (!(v instanceof Map)) {
    throw new ShapeError(path, `expected an object, found ${describe(v)}`);
  }
  for (const k of v.keys()) {
    if (!allowed.includes(k)) {
      throw new ShapeError(path, `unknown member \`${k}\``);
    }
  }
  return v;
}

/** A member that may be absent or `null` (both mean absent). */
function opt<T>(m: Members, key: string, path: string, read: (v: JsonValue, p: string) => T): T | undefined {
  const v = m.get(key);
  return v === undefined || v === null ? undefined : read(v, `${path}.${key}`);
}

/** Sets `out[key]` to the member `key` when it is there (absent and `null` leave it unset). */
function optInto<O extends object, K extends keyof O & string>(
  out: O,
  m: Members,
  key: K,
  path: string,
  read: (v: JsonValue, p: string) => NonNullable<O[K]>,
): void {
  const v = opt(m, key, path, read);
  if (v !== undefined) out[key] = v;
}

/** A member that must be present and not `null`. */
function req<T>(m: Members, key: string, path: string, read: (v: JsonValue, p: string) => T): T {
  const v = m.get(key);
  if (v === undefined || v === null) {
    throw new ShapeError(`${path}.${key}`, "missing (required)");
  }
  return read(v, `${path}.${key}`);
}

function str(v: JsonValue, path: string): string {
  if (typeof v !== "string") {
    throw new ShapeError(path, `expected a string, found ${describe(v)}`);
  }
  return v;
}

function bool(v: JsonValue, path: string): boolean {
  if (typeof v !== "boolean") {
    throw new ShapeError(path, `expected a boolean, found ${describe(v)}`);
  }
  return v;
}

/** An integer within [min, max], written without fraction or exponent. */
function integer(min: bigint, max: bigint, type: string): (v: JsonValue, path: string) => number {
  return (v, path) => {
    if (!(v instanceof JsonNumber) || !/^-?(?:0|[1-9][0-9]*)$/.test(v.text)) {
      throw new ShapeError(path, `expected an integer (${type}), found ${describe(v)}`);
    }
    const n = BigInt(v.text);
    if (n < min || n > max) {
      throw new ShapeError(path, `${v.text} is out of range for ${type}`);
    }
    if (n > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new ShapeError(
        path,
        `${v.text} is above 2^53 - 1, the largest integer this client represents exactly`,
      );
    }
    return Number(n);
  };
}

/** A finite JSON number, as the binary64 nearest it (an integer is one too). */
function f64(v: JsonValue, path: string): number {
  if (!(v instanceof JsonNumber)) {
    throw new ShapeError(path, `expected a number, found ${describe(v)}`);
  }
  const n = Number(v.text);
  if (!Number.isFinite(n)) {
    throw new ShapeError(path, `${v.text} is not a finite binary64 number`);
  }
  return n;
}

const u16 = integer(0n, 0xffffn, "u16");
const u32 = integer(0n, 0xffffffffn, "u32");
const u64 = integer(0n, 0xffffffffffffffffn, "u64");
const i32 = integer(-0x80000000n, 0x7fffffffn, "i32");

function oneOf<T extends string>(values: readonly T[], type: string): (v: JsonValue, path: string) => T {
  return (v, path) => {
    const s = str(v, path);
    if (!(values as readonly string[]).includes(s)) {
      throw new ShapeError(path, `\`${s}\` is not a ${type} (one of ${values.join(", ")})`);
    }
    return s as T;
  };
}

const tier = oneOf<Tier>(TIERS, "tier");
const start = oneOf<Start>(STARTS, "start");
const credentialKind = oneOf<CredentialKind>(CREDENTIAL_KINDS, "credential kind");
const reason = oneOf<Reason>(REASONS, "reason");
const language = oneOf<Language>(["javascript", "python"], "language");
const endReason = oneOf<EndReason>(END_REASONS, "session end reason");
const trialEnd = oneOf<TrialEnd>(TRIAL_ENDS, "trial end");
const sessionStart = oneOf<SessionStart>(SESSION_STARTS, "session start");

/** Bytes in either wire form. */
function bytes(v: JsonValue, path: string): Uint8Array {
  if (typeof v === "string") {
    return utf8(v);
  }
  const m = object(v, path, ["base64"]);
  const b64 = req(m, "base64", path, str);
  const out = decodeBase64(b64);
  if (out === undefined) {
    throw new ShapeError(`${path}.base64`, "not strict standard base64 (alphabet, `=` padding, zero trailing bits)");
  }
  return out;
}

function list<T>(read: (v: JsonValue, p: string) => T): (v: JsonValue, path: string) => T[] {
  return (v, path) => {
    if (!Array.isArray(v)) {
      throw new ShapeError(path, `expected a list, found ${describe(v)}`);
    }
    return v.map((item, i) => read(item, `${path}[${i}]`));
  };
}

/** An object of names to values, as a plain record (names kept as own properties). */
function map<T>(read: (v: JsonValue, p: string) => T): (v: JsonValue, path: string) => Record<string, T> {
  return (v, path) => {
    if (!(v instanceof Map)) {
      throw new ShapeError(path, `expected an object, found ${describe(v)}`);
    }
    return Object.fromEntries([...v].map(([k, x]) => [k, read(x, `${path}.${k}`)]));
  };
}

const strings = list(str);
const stringMap = map(str);

/** A list member that may be absent (its default, the empty list). */
function optList<T>(m: Members, key: string, path: string, read: (v: JsonValue, p: string) => T): T[] {
  return opt(m, key, path, list(read)) ?? [];
}

// ---------------------------------------------------------------------------------------
// Requests (this client's own, read back from the bytes it sends; and golden vectors).

function limits(v: JsonValue, path: string): Limits {
  const m = object(v, path, LIMIT_NAMES);
  const out: Limits = {};
  for (const k of LIMIT_NAMES) {
    optInto(out, m, k, path, u64);
  }
  return out;
}

function runSpec(v: JsonValue, path: string): SentRunSpec {
  const kind = (() => {
    const m = object(v, path, ["kind", "language", "code", "files", "steps", "artifacts"]);
    return req(m, "kind", path, oneOf(["snippet", "project"] as const, "run kind"));
  })();
  if (kind === "snippet") {
    const m = object(v, path, ["kind", "language", "code"]);
    return { kind, language: req(m, "language", path, language), code: req(m, "code", path, str) };
  }
  const m = object(v, path, ["kind", "files", "steps", "artifacts"]);
  return {
    kind,
    files: optList(m, "files", path, (f, p) => {
      const fm = object(f, p, ["path", "content", "executable"]);
      return {
        path: req(fm, "path", p, str),
        content: req(fm, "content", p, bytes),
        executable: opt(fm, "executable", p, bool) ?? false,
      };
    }),
    steps: req(m, "steps", path, list((s, p) => {
      const sm = object(s, p, ["name", "run"]);
      const name = opt(sm, "name", p, str);
      const run = req(sm, "run", p, str);
      return name === undefined ? { run } : { name, run };
    })),
    artifacts: optList(m, "artifacts", path, str),
  };
}

/** Reads a run request. */
export function readRunRequest(v: JsonValue, path = "request"): RunRequest {
  const m = object(v, path, [
    "protocol",
    "request_id",
    "minimum_isolation",
    "provider",
    "limits",
    "run",
    "grant",
    "image",
  ]);
  const out: RunRequest = {
    protocol: req(m, "protocol", path, u32),
    request_id: req(m, "request_id", path, str),
    run: req(m, "run", path, runSpec),
  };
  optInto(out, m, "minimum_isolation", path, tier);
  optInto(out, m, "provider", path, str);
  optInto(out, m, "limits", path, limits);
  optInto(out, m, "grant", path, str);
  optInto(out, m, "image", path, str);
  return out;
}

// ---------------------------------------------------------------------------------------
// Answers.

const OUTCOME_MEMBERS = [
  "exit_code",
  "signal",
  "timed_out",
  "oom_killed",
  "stdout",
  "stdout_truncated",
  "stderr",
  "stderr_truncated",
] as const;

function outcome(m: Members, path: string): Outcome {
  const out: Outcome = {
    // Nullable: servers send `null` when a signal ended the run; absent reads the same.
    exit_code: opt(m, "exit_code", path, i32) ?? null,
    timed_out: req(m, "timed_out", path, bool),
    oom_killed: opt(m, "oom_killed", path, bool) ?? false,
    stdout: req(m, "stdout", path, bytes),
    stdout_truncated: req(m, "stdout_truncated", path, bool),
    stderr: req(m, "stderr", path, bytes),
    stderr_truncated: req(m, "stderr_truncated", path, bool),
  };
  optInto(out, m, "signal", path, i32);
  return out;
}

function stepResult(v: JsonValue, path: string): StepResult {
  const m = object(v, path, [...OUTCOME_MEMBERS, "name", "duration_ms"]);
  const out: StepResult = { ...outcome(m, path), duration_ms: req(m, "duration_ms", path, u64) };
  optInto(out, m, "name", path, str);
  return out;
}

function artifact(v: JsonValue, path: string): Artifact {
  const m = object(v, path, ["path", "found", "size", "content", "truncated"]);
  return {
    path: req(m, "path", path, str),
    found: req(m, "found", path, bool),
    size: req(m, "size", path, u64),
    content: req(m, "content", path, bytes),
    truncated: req(m, "truncated", path, bool),
  };
}

function grantCall(v: JsonValue, path: string): GrantCall {
  const m = object(v, path, [
    "method",
    "route",
    "status",
    "error",
    "request_bytes",
    "response_bytes",
    "latency_ms",
    "credential",
  ]);
  const out: GrantCall = {
    method: req(m, "method", path, str),
    request_bytes: req(m, "request_bytes", path, u64),
    response_bytes: req(m, "response_bytes", path, u64),
    latency_ms: req(m, "latency_ms", path, u64),
  };
  optInto(out, m, "route", path, str);
  optInto(out, m, "status", path, u16);
  optInto(out, m, "error", path, str);
  optInto(out, m, "credential", path, credentialKind);
  return out;
}

function egressReceipt(v: JsonValue, path: string): EgressReceipt {
  const m = object(v, path, [
    "host",
    "port",
    "kind",
    "address",
    "sni",
    "bytes_up",
    "bytes_down",
    "start_ms",
    "end_ms",
    "verdict",
    "rule",
    "ended",
  ]);
  const out: EgressReceipt = {
    host: req(m, "host", path, str),
    port: req(m, "port", path, u16),
    kind: req(m, "kind", path, str),
    bytes_up: req(m, "bytes_up", path, u64),
    bytes_down: req(m, "bytes_down", path, u64),
    start_ms: req(m, "start_ms", path, u64),
    end_ms: req(m, "end_ms", path, u64),
    verdict: req(m, "verdict", path, str),
    rule: req(m, "rule", path, str),
  };
  optInto(out, m, "address", path, str);
  optInto(out, m, "sni", path, str);
  optInto(out, m, "ended", path, str);
  return out;
}

function wallNamespace(v: JsonValue, path: string): WallNamespace {
  const m = object(v, path, ["name", "id", "same_as_host"]);
  const out: WallNamespace = { name: req(m, "name", path, str), id: req(m, "id", path, str) };
  optInto(out, m, "same_as_host", path, bool);
  return out;
}

const WALL_CAPS = ["cap_inh", "cap_prm", "cap_eff", "cap_bnd", "cap_amb"] as const;

function wall(v: JsonValue, path: string): Wall {
  const m = object(v, path, [
    "uid",
    "euid",
    "gid",
    "groups",
    ...WALL_CAPS,
    "no_new_privs",
    "seccomp",
    "namespaces",
    "root_read_only",
    "network_interfaces",
    "memory_limit_bytes",
    "pids_limit",
  ]);
  const out: Wall = {
    uid: req(m, "uid", path, u32),
    euid: req(m, "euid", path, u32),
    gid: req(m, "gid", path, u32),
    groups: optList(m, "groups", path, u32),
    namespaces: optList(m, "namespaces", path, wallNamespace),
    root_read_only: req(m, "root_read_only", path, bool),
    network_interfaces: optList(m, "network_interfaces", path, str),
  };
  for (const cap of WALL_CAPS) optInto(out, m, cap, path, str);
  optInto(out, m, "no_new_privs", path, bool);
  optInto(out, m, "seccomp", path, u32);
  optInto(out, m, "memory_limit_bytes", path, u64);
  optInto(out, m, "pids_limit", path, u64);
  return out;
}

/** Reads a run result. */
export function readRunResult(v: JsonValue, path = "result"): RunResult {
  const m = object(v, path, [
    ...OUTCOME_MEMBERS,
    "steps",
    "artifacts",
    "calls",
    "start",
    "member_age_ms",
    "wall",
    "state_kept",
    "interpreter_end",
    "egress",
  ]);
  const out: RunResult = {
    ...outcome(m, path),
    steps: optList(m, "steps", path, stepResult),
    artifacts: optList(m, "artifacts", path, artifact),
    calls: optList(m, "calls", path, grantCall),
    egress: optList(m, "egress", path, egressReceipt),
  };
  optInto(out, m, "start", path, start);
  optInto(out, m, "member_age_ms", path, u64);
  optInto(out, m, "wall", path, wall);
  optInto(out, m, "state_kept", path, bool);
  optInto(out, m, "interpreter_end", path, endReason);
  return out;
}

function sessionLink(v: JsonValue, path: string): SessionLink {
  const m = object(v, path, ["session_id", "sequence", "previous_record_sha256", "origin"]);
  const out: SessionLink = { session_id: req(m, "session_id", path, str), sequence: req(m, "sequence", path, u64) };
  optInto(out, m, "previous_record_sha256", path, str);
  optInto(out, m, "origin", path, sessionOrigin);
  return out;
}

/** Where a restored or forked session came from (a session's, and each of its records'). */
function sessionOrigin(v: JsonValue, path: string): SessionOrigin {
  const m = object(v, path, ["start", "snapshot_sha256", "parent_session_id", "parent_record_sha256", "parent_calls"]);
  const out: SessionOrigin = {
    start: req(m, "start", path, sessionStart),
    snapshot_sha256: req(m, "snapshot_sha256", path, str),
    parent_session_id: req(m, "parent_session_id", path, str),
    parent_calls: req(m, "parent_calls", path, u64),
  };
  optInto(out, m, "parent_record_sha256", path, str);
  return out;
}

function imageRef(v: JsonValue, path: string): ImageRef {
  const m = object(v, path, ["name", "identity"]);
  return { name: req(m, "name", path, str), identity: req(m, "identity", path, str) };
}

function trialOutcome(v: JsonValue, path: string): TrialOutcome {
  const m = object(v, path, ["scenario", "end", "reason", "ticks", "score", "pass", "fingerprint"]);
  const out: TrialOutcome = {
    end: req(m, "end", path, trialEnd),
    ticks: req(m, "ticks", path, u64),
    pass: req(m, "pass", path, bool),
    fingerprint: req(m, "fingerprint", path, str),
  };
  optInto(out, m, "scenario", path, str);
  optInto(out, m, "reason", path, str);
  optInto(out, m, "score", path, f64);
  return out;
}

function trialStepRecord(v: JsonValue, path: string): TrialStepRecord {
  const m = object(v, path, ["step", "simulator", "pass", "trials"]);
  return {
    step: req(m, "step", path, u32),
    simulator: req(m, "simulator", path, (s, p) => {
      const sm = object(s, p, ["name", "version", "sha256"]);
      return { name: req(sm, "name", p, str), version: req(sm, "version", p, str), sha256: req(sm, "sha256", p, str) };
    }),
    pass: req(m, "pass", path, bool),
    trials: req(m, "trials", path, list(trialOutcome)),
  };
}

/** Reads a run record. */
export function readRunRecord(v: JsonValue, path = "record"): RunRecord {
  const m = object(v, path, [
    "request_id",
    "request_sha256",
    "result_sha256",
    "provider",
    "isolation",
    "minimum_isolation",
    "evidence_sha256",
    "environment",
    "started_unix_ms",
    "ended_unix_ms",
    "session",
    "image",
    "trials",
    "record_sha256",
  ]);
  const floor = opt(m, "minimum_isolation", path, tier);
  const session = opt(m, "session", path, sessionLink);
  const image = opt(m, "image", path, imageRef);
  return {
    request_id: req(m, "request_id", path, str),
    request_sha256: req(m, "request_sha256", path, str),
    result_sha256: req(m, "result_sha256", path, str),
    provider: req(m, "provider", path, str),
    isolation: req(m, "isolation", path, tier),
    ...(floor === undefined ? {} : { minimum_isolation: floor }),
    evidence_sha256: req(m, "evidence_sha256", path, str),
    environment: req(m, "environment", path, str),
    started_unix_ms: req(m, "started_unix_ms", path, u64),
    ended_unix_ms: req(m, "ended_unix_ms", path, u64),
    ...(session === undefined ? {} : { session }),
    ...(image === undefined ? {} : { image }),
    // Absent, null or empty for a run without trial steps.
    trials: optList(m, "trials", path, trialStepRecord),
    record_sha256: req(m, "record_sha256", path, str),
  };
}

/** Reads a `200` answer to `POST /v1/runs` (not yet verified). */
export function readRunResponse(v: JsonValue, path = "answer"): RunResponse {
  const m = object(v, path, [
    "protocol",
    "request_id",
    "provider",
    "isolation",
    "duration_ms",
    "request_sha256",
    "result_sha256",
    "result",
    "record",
  ]);
  return {
    protocol: req(m, "protocol", path, u32),
    request_id: req(m, "request_id", path, str),
    provider: req(m, "provider", path, str),
    isolation: req(m, "isolation", path, tier),
    duration_ms: req(m, "duration_ms", path, u64),
    request_sha256: req(m, "request_sha256", path, str),
    result_sha256: req(m, "result_sha256", path, str),
    result: req(m, "result", path, readRunResult),
    record: req(m, "record", path, readRunRecord),
  };
}

/** Reads an error answer. */
export function readErrorResponse(v: JsonValue, path = "answer"): ErrorResponse {
  const m = object(v, path, ["protocol", "request_id", "error"]);
  const e = req(m, "error", path, (x, p) => object(x, p, ["code", "message", "not_dispatched", "end_reason"]));
  const ep = `${path}.error`;
  const out: ErrorResponse = {
    protocol: req(m, "protocol", path, u32),
    // Nullable members: always sent by servers, `null` and absent read the same.
    request_id: opt(m, "request_id", path, str) ?? null,
    error: {
      code: req(e, "code", ep, str),
      message: req(e, "message", ep, str),
      not_dispatched: opt(e, "not_dispatched", ep, reason) ?? null,
    },
  };
  optInto(out.error, e, "end_reason", ep, endReason);
  return out;
}

function binary(v: JsonValue, path: string): BinaryIdentity {
  const m = object(v, path, ["name", "path", "version", "sha256"]);
  return {
    name: req(m, "name", path, str),
    path: req(m, "path", path, str),
    version: req(m, "version", path, str),
    sha256: req(m, "sha256", path, str),
  };
}

function namespaceSeen(v: JsonValue, path: string): NamespaceSeen {
  const m = object(v, path, ["id", "same_as_host"]);
  const out: NamespaceSeen = { id: req(m, "id", path, str) };
  optInto(out, m, "same_as_host", path, bool);
  return out;
}

function probeReport(v: JsonValue, path: string): ProbeReport {
  const m = object(v, path, [
    "uid",
    "euid",
    "gid",
    "groups",
    "capabilities",
    "no_new_privs",
    "seccomp_mode",
    "environment",
    "cwd",
    "namespaces",
    "mounts",
    "write_attempts",
    "read_attempts",
    "network_interfaces",
    "socket_attempts",
    "limits",
    "kernel_release",
    "hostname",
  ]);
  return {
    uid: req(m, "uid", path, u32),
    euid: req(m, "euid", path, u32),
    gid: req(m, "gid", path, u32),
    groups: req(m, "groups", path, list(u32)),
    capabilities: req(m, "capabilities", path, stringMap),
    no_new_privs: req(m, "no_new_privs", path, bool),
    seccomp_mode: req(m, "seccomp_mode", path, u32),
    environment: req(m, "environment", path, strings),
    cwd: req(m, "cwd", path, str),
    namespaces: req(m, "namespaces", path, map(namespaceSeen)),
    mounts: req(m, "mounts", path, stringMap),
    write_attempts: req(m, "write_attempts", path, stringMap),
    read_attempts: req(m, "read_attempts", path, stringMap),
    network_interfaces: req(m, "network_interfaces", path, strings),
    socket_attempts: req(m, "socket_attempts", path, stringMap),
    limits: req(m, "limits", path, stringMap),
    kernel_release: req(m, "kernel_release", path, str),
    hostname: req(m, "hostname", path, str),
  };
}

/** Reads a provider's evidence. */
export function readEvidence(v: JsonValue, path = "evidence"): Evidence {
  const m = object(v, path, [
    "provider",
    "isolation",
    "config",
    "binaries",
    "probe",
    "checks",
    "environment",
    "checked_unix_ms",
  ]);
  const out: Evidence = {
    provider: req(m, "provider", path, str),
    isolation: req(m, "isolation", path, tier),
    config: req(m, "config", path, stringMap),
    binaries: req(m, "binaries", path, list(binary)),
    checks: req(m, "checks", path, stringMap),
    environment: req(m, "environment", path, str),
    checked_unix_ms: req(m, "checked_unix_ms", path, u64),
  };
  optInto(out, m, "probe", path, probeReport);
  return out;
}

function providerInfo(v: JsonValue, path: string): ProviderInfo {
  const m = object(v, path, [
    "name",
    "isolation",
    "available",
    "unavailable_reason",
    "evidence",
    "evidence_sha256",
  ]);
  const out: ProviderInfo = {
    name: req(m, "name", path, str),
    isolation: req(m, "isolation", path, tier),
    available: req(m, "available", path, bool),
    evidence: req(m, "evidence", path, readEvidence),
    evidence_sha256: req(m, "evidence_sha256", path, str),
  };
  optInto(out, m, "unavailable_reason", path, str);
  return out;
}

/** A SHA-256 written as 64 lowercase hex digits. */
function sha256Hex(v: JsonValue, path: string): string {
  const s = str(v, path);
  if (!/^[0-9a-f]{64}$/.test(s)) {
    throw new ShapeError(path, "expected 64 lowercase hex digits");
  }
  return s;
}

function simulatorEntry(v: JsonValue, path: string): SimulatorEntry {
  const m = object(v, path, ["name", "path", "sha256"]);
  return {
    name: req(m, "name", path, str),
    path: req(m, "path", path, str),
    sha256: req(m, "sha256", path, sha256Hex),
  };
}

function imageInfo(v: JsonValue, path: string): ImageInfo {
  const m = object(v, path, ["name", "identity", "default", "languages", "vm_disk", "simulators"]);
  return {
    name: req(m, "name", path, str),
    identity: req(m, "identity", path, str),
    default: req(m, "default", path, bool),
    languages: optList(m, "languages", path, language),
    vm_disk: opt(m, "vm_disk", path, bool) ?? false,
    // Absent, null or empty when the image declares none.
    simulators: optList(m, "simulators", path, simulatorEntry),
  };
}

/** Reads the answer to `GET /v1/providers` (not yet verified). */
export function readProvidersResponse(v: JsonValue, path = "answer"): ProvidersResponse {
  const m = object(v, path, ["protocol", "default_floor", "providers", "images"]);
  return {
    protocol: req(m, "protocol", path, u32),
    default_floor: req(m, "default_floor", path, tier),
    providers: req(m, "providers", path, list(providerInfo)),
    // Absent, null or empty from a daemon without images.
    images: optList(m, "images", path, imageInfo),
  };
}

// ---------------------------------------------------------------------------------------
// Sessions (docs/sessions.md).

/** Reads a session as `POST /v1/sessions`, `GET /v1/sessions[/{id}]` and `DELETE` answer it. */
export function readSessionInfo(v: JsonValue, path = "session"): SessionInfo {
  const m = object(v, path, [
    "protocol",
    "request_id",
    "session_id",
    "language",
    "provider",
    "isolation",
    "minimum_isolation",
    "evidence_sha256",
    "environment",
    "image",
    "wall",
    "opened_unix_ms",
    "expires_unix_ms",
    "idle_timeout_ms",
    "calls",
    "last_record_sha256",
    "interpreter_alive",
    "end_reason",
    "origin",
  ]);
  const out: SessionInfo = {
    protocol: req(m, "protocol", path, u32),
    session_id: req(m, "session_id", path, str),
    language: req(m, "language", path, language),
    provider: req(m, "provider", path, str),
    isolation: req(m, "isolation", path, tier),
    minimum_isolation: req(m, "minimum_isolation", path, tier),
    evidence_sha256: req(m, "evidence_sha256", path, str),
    environment: req(m, "environment", path, str),
    wall: req(m, "wall", path, wall),
    opened_unix_ms: req(m, "opened_unix_ms", path, u64),
    expires_unix_ms: req(m, "expires_unix_ms", path, u64),
    idle_timeout_ms: req(m, "idle_timeout_ms", path, u64),
    calls: req(m, "calls", path, u64),
    interpreter_alive: req(m, "interpreter_alive", path, bool),
  };
  optInto(out, m, "request_id", path, str);
  optInto(out, m, "last_record_sha256", path, str);
  optInto(out, m, "end_reason", path, endReason);
  optInto(out, m, "image", path, imageRef);
  optInto(out, m, "origin", path, sessionOrigin);
  return out;
}

/** Reads the answer to `GET /v1/sessions`. */
export function readSessionList(v: JsonValue, path = "answer"): SessionList {
  const m = object(v, path, ["protocol", "sessions"]);
  return {
    protocol: req(m, "protocol", path, u32),
    sessions: req(m, "sessions", path, list(readSessionInfo)),
  };
}

/** Reads a snapshot, as `POST /v1/sessions/{id}/snapshot`, `GET /v1/snapshots` and `DELETE` show it. */
export function readSnapshotInfo(v: JsonValue, path = "snapshot"): SnapshotInfo {
  const m = object(v, path, [
    "protocol",
    "request_id",
    "snapshot_id",
    "session_id",
    "sha256",
    "bytes",
    "provider",
    "isolation",
    "language",
    "calls",
    "last_record_sha256",
    "checkpoint_ms",
    "created_unix_ms",
    "expires_unix_ms",
  ]);
  const out: SnapshotInfo = {
    protocol: req(m, "protocol", path, u32),
    snapshot_id: req(m, "snapshot_id", path, str),
    session_id: req(m, "session_id", path, str),
    sha256: req(m, "sha256", path, str),
    bytes: req(m, "bytes", path, u64),
    provider: req(m, "provider", path, str),
    isolation: req(m, "isolation", path, tier),
    language: req(m, "language", path, language),
    calls: req(m, "calls", path, u64),
    checkpoint_ms: req(m, "checkpoint_ms", path, u64),
    created_unix_ms: req(m, "created_unix_ms", path, u64),
    expires_unix_ms: req(m, "expires_unix_ms", path, u64),
  };
  optInto(out, m, "request_id", path, str);
  optInto(out, m, "last_record_sha256", path, str);
  return out;
}

/** Reads the answer to `GET /v1/snapshots`. */
export function readSnapshotList(v: JsonValue, path = "answer"): SnapshotList {
  const m = object(v, path, ["protocol", "snapshots"]);
  return {
    protocol: req(m, "protocol", path, u32),
    snapshots: req(m, "snapshots", path, list(readSnapshotInfo)),
  };
}

/** Reads the answer to `POST /v1/sessions/{id}/fork` (not yet checked). */
export function readForkAnswer(v: JsonValue, path = "answer"): ForkAnswer {
  const m = object(v, path, ["protocol", "request_id", "snapshot", "sessions"]);
  return {
    protocol: req(m, "protocol", path, u32),
    request_id: req(m, "request_id", path, str),
    snapshot: req(m, "snapshot", path, readSnapshotInfo),
    sessions: req(m, "sessions", path, list(readSessionInfo)),
  };
}

const outputStream = oneOf<OutputStream>(["stdout", "stderr"], "stream");

/** Reads one line of a streamed answer (`Accept: application/x-ndjson`), not yet verified. */
export function readStreamLine(v: JsonValue, path = "line"): StreamLine {
  const m = object(v, path, ["chunk", "response", "error"]);
  if (m.size !== 1) {
    throw new ShapeError(path, `a stream line has exactly one of \`chunk\`, \`response\`, \`error\`, not ${m.size} members`);
  }
  if (m.has("response")) return { response: req(m, "response", path, readRunResponse) };
  if (m.has("error")) return { error: req(m, "error", path, readErrorResponse) };
  const c = req(m, "chunk", path, (x, p) => object(x, p, ["preview", "stream", "offset", "bytes"]));
  const cp = `${path}.chunk`;
  if (req(c, "preview", cp, bool) !== true) {
    throw new ShapeError(`${cp}.preview`, "a chunk is always a preview (`true`)");
  }
  return {
    chunk: {
      preview: true,
      stream: req(c, "stream", cp, outputStream),
      offset: req(c, "offset", cp, u64),
      bytes: req(c, "bytes", cp, bytes),
    },
  };
}

// ---------------------------------------------------------------------------------------
// From JSON text or bytes, for callers that hold a stored exchange (and the golden vectors).

/** Parses and reads a run request from its JSON. */
export function decodeRunRequest(json: Uint8Array | string): RunRequest {
  return readRunRequest(parseJson(json));
}

/** Parses and reads a run result from its JSON. */
export function decodeRunResult(json: Uint8Array | string): RunResult {
  return readRunResult(parseJson(json));
}

/** Parses and reads a run record from its JSON. */
export function decodeRunRecord(json: Uint8Array | string): RunRecord {
  return readRunRecord(parseJson(json));
}

/** Parses and reads provider evidence from its JSON. */
export function decodeEvidence(json: Uint8Array | string): Evidence {
  return readEvidence(parseJson(json));
}

/** Parses and reads a run response from its JSON (it is not verified: see `verifyResponse`). */
export function decodeRunResponse(json: Uint8Array | string): RunResponse {
  return readRunResponse(parseJson(json));
}

/** Parses and reads a `GET /v1/providers` answer from its JSON (its evidence digests are not checked: `client.providers()` checks them). */
export function decodeProvidersResponse(json: Uint8Array | string): ProvidersResponse {
  return readProvidersResponse(parseJson(json));
}

/** Parses and reads a session (`SessionInfo`) from its JSON. */
export function decodeSessionInfo(json: Uint8Array | string): SessionInfo {
  return readSessionInfo(parseJson(json));
}

/** Parses and reads a snapshot (`SnapshotInfo`) from its JSON. */
export function decodeSnapshotInfo(json: Uint8Array | string): SnapshotInfo {
  return readSnapshotInfo(parseJson(json));
}

/** Parses and reads a fork's answer (`ForkAnswer`) from its JSON (it is not checked). */
export function decodeForkAnswer(json: Uint8Array | string): ForkAnswer {
  return readForkAnswer(parseJson(json));
}

/** Parses and reads one line of a streamed answer from its JSON (a response in it is not verified). */
export function decodeStreamLine(json: Uint8Array | string): StreamLine {
  return readStreamLine(parseJson(json));
}
