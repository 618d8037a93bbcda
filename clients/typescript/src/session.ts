/**
 * Sessions (docs/sessions.md): one sandbox kept across calls, an interpreter whose state
 * survives from one cell to the next, shell steps and files in the same /work. Every call's
 * answer is verified as a run's is (request id, floor, digests), and besides: its record names
 * this session, the next sequence number and the previous call's record digest, and the
 * session's provider, tier, evidence and environment. A refusal is believed only with the
 * echoed request id, as any other; a session's end reason rides on the error. Snapshots and
 * forks ("Snapshots and forks"): a session saved, new sessions opened from the snapshot, each
 * held to where it came from (./snapshot.ts).
 * @module
 */

import { inspect } from "node:util";

import { RequestShapeError, buildLimits, buildRun, fail, image, only, positive, projectPath, provider, text, tier } from "./build.js";
import { utf8 } from "./bytes.js";
import {
  EvidenceMismatchError,
  MayHaveRunError,
  NotDispatchedError,
  ProviderMismatchError,
  ProvidersError,
  RequestTooLargeError,
  SessionLookupError,
  SessionMismatchError,
} from "./errors.js";
import {
  DEFAULT_RUN_BUDGET_MS,
  EXCHANGE_SLACK_MS,
  ExchangeFailure,
  type Http,
  LOOKUP_BUDGET_MS,
  NDJSON,
  REQUEST_ID_HEADER,
  badResponse,
  describeError,
  exchangeError,
  newRequestId,
  preview,
  readAnswer,
  refusal,
  refusalOf,
  unreachable,
} from "./http.js";
import { JsonSyntaxError, type JsonValue, parseJson } from "./json.js";
import {
  ShapeError,
  readErrorResponse,
  readForkAnswer,
  readRunRequest,
  readRunResponse,
  readSessionInfo,
  readSessionList,
  readSnapshotInfo,
  readSnapshotList,
  readStreamLine,
} from "./read.js";
import {
  type CopyParent,
  checkCopy,
  checkSnapshotShape,
  describeOrigin,
  originDifference,
  restoreBoundaryDifference,
  restoredSince,
} from "./snapshot.js";
import {
  type Artifact,
  type EndReason,
  type ErrorResponse,
  type ForkAnswer,
  type Language,
  type Limits,
  type OutputChunk,
  PROTOCOL,
  type ProjectFile,
  type RunRequest,
  type RunResponse,
  type SessionInfo,
  type SessionList,
  type SnapshotInfo,
  type SnapshotList,
  type Step,
  TIERS,
  type Tier,
  isSessionId,
  isSnapshotId,
  tierRank,
} from "./types.js";
import { type Floor, checkImage, verifyResponse } from "./verify.js";

/** What to open a session with; the client adds the protocol and a fresh request id. */
export interface SessionOptions {
  /** The language of its interpreter (its cells). */
  language: Language;
  /**
   * The floor: the weakest tier to accept. Absent: the daemon's default floor, learnt from
   * `GET /v1/providers` and checked against.
   */
  minimum_isolation?: Tier;
  /** A provider that keeps sessions (crun, runc, runsc); the daemon chooses when absent. */
  provider?: string;
  /**
   * A grant profile the operator defined (an API grant or an egress grant), held for the
   * session's whole life: each call's result lists the broker calls (`result.calls`) and
   * egress receipts (`result.egress`) since the call before. A call cannot name one.
   */
  grant?: string;
  /**
   * `memory_bytes`, `pids`, `disk_bytes` hold for the session's whole life; `timeout_ms`,
   * `output_bytes` and `artifact_bytes` are each call's defaults.
   */
  limits?: Limits;
  /** The session ends after this long without a call, milliseconds (default 300 s). */
  idle_timeout_ms?: number;
  /** The session ends this long after it opened, milliseconds (default 1 h). */
  max_lifetime_ms?: number;
  /**
   * The image it runs in, fixed at open: an image name or identity (`sha256:...`). Absent: the
   * operator's default image. The session, and every call's record, must name it, or the
   * open (or the call) fails with an {@link ImageMismatchError}.
   */
  image?: string;
  /** Aborts the exchange: "may have run" (`transport`), as the session may have been opened. */
  signal?: AbortSignal;
}

/** Gets each chunk of a call's output as it comes: a preview, covered by no digest. */
export type ChunkHandler = (chunk: OutputChunk) => void;

/** How to send one cell. */
export interface CellOptions {
  /** Start a fresh interpreter first (its state is lost; `state_kept` is then `false`). */
  restart?: boolean;
  /** This cell's timeout, milliseconds (the session's by default). */
  timeoutMs?: number;
  /**
   * Streams the call (`Accept: application/x-ndjson`): each chunk of output goes here as it
   * comes. The promise still resolves to the whole, verified response.
   */
  onChunk?: ChunkHandler;
  /** Aborts the exchange: "may have run" (`transport`). */
  signal?: AbortSignal;
}

/** How to send one steps call. */
export interface StepsOptions {
  /** The call's timeout, milliseconds (the session's by default). */
  timeoutMs?: number;
  /** Streams the call, as {@link CellOptions.onChunk}. */
  onChunk?: ChunkHandler;
  /** Files written into /work before the steps. */
  files?: ProjectFile[];
  /** Paths under /work returned after the steps, in this order. */
  artifacts?: string[];
  /** Aborts the exchange: "may have run" (`transport`). */
  signal?: AbortSignal;
}

/** A file read from a session's /work: the artifact and the verified call that read it. */
export interface SessionFile extends Artifact {
  /** The call's verified response (its record is the call's link in the chain). */
  response: RunResponse;
}

/**
 * A fork (`session.fork(count)`): the snapshot taken of the session, kept until it expires or
 * is deleted, and the copies opened from it, each a {@link Session} of its own.
 */
export interface Fork {
  snapshot: SnapshotInfo;
  sessions: Session[];
}

/** How to open a session from a snapshot (`client.openSnapshot`). */
export interface SnapshotOpenOptions {
  /**
   * The snapshot's digest (its `sha256`): the daemon refuses a snapshot whose files no longer
   * hash to it, and the session must name it as its origin. Given a `SnapshotInfo`, its own.
   */
  sha256?: string;
  /** Its tier must meet this floor too (it keeps the floor of the session it was taken of). */
  minimum_isolation?: Tier;
  /** Aborts the exchange: "may have run" (`transport`), as a session may have been opened. */
  signal?: AbortSignal;
}

/** What a session's constructor takes: only the client makes sessions. */
export interface SessionInternals {
  http: Http;
  maxBodyBytes: number;
  info: SessionInfo;
  /** The image the open named (a name or an identity): every call's record must name it. */
  image?: string | undefined;
}

const OPEN_MAY_HAVE = "a session may have been opened";
const CLOSE_MAY_HAVE = "the session may have been closed";
const SNAPSHOT_MAY_HAVE = "a snapshot may have been taken";
const FORK_MAY_HAVE = "a snapshot may have been taken and copies of the session opened";
const DELETE_MAY_HAVE = "the snapshot may have been deleted";
/** The ends of an interpreter (a cell's `interpreter_end`); the others end the session. */
const INTERPRETER_ENDS: readonly EndReason[] = ["interpreter_crash", "out_of_memory", "cell_timeout"];

/**
 * An open session of this client's caller. Its calls are sent one at a time, in the order
 * they were made (the daemon serves a session's calls so, and the client follows its chain);
 * a call made while another is under way waits for it.
 *
 * After a call that fails "may have run", the chain's position is unknown: the session sends
 * nothing more (`chain_in_doubt`, not dispatched) until {@link Session.resync} takes the
 * daemon's word for where it stands.
 *
 * A session can outlive a daemon restart (docs/sessions.md, "Across a restart"): restored
 * under its own id, its records say so from the call after its last saved one (an origin
 * `restored` from itself at that call), and from there it runs at the tier and evidence the
 * restoring daemon measured. The client takes that change at exactly that call, and no other.
 */
export class Session {
  readonly #http: Http;
  readonly #maxBodyBytes: number;
  /** The session as opened: what every call is checked against (but {@link Session.#runs}). */
  readonly #opened: SessionInfo;
  /**
   * Where the session runs now, as every record must say: as opened, until a daemon restart
   * restored it under its own id (then that origin, and the restoring daemon's tier and
   * evidence).
   */
  #runs: Pick<SessionInfo, "origin" | "isolation" | "evidence_sha256">;
  /** The image the open named, if it named one: every call's record must name it. */
  readonly #image: string | undefined;
  #info: SessionInfo;
  /** The sequence number and record digest of the last call answered. */
  #last: { sequence: number; record: string | undefined };
  /** Why the chain's position is unknown, after a call that may have run unverified. */
  #doubt: string | undefined;
  #queue: Promise<unknown> = Promise.resolve();

  /**
   * Not for use: `client.openSession(...)` opens one, `client.session(id)` resumes one,
   * `client.openSnapshot(...)` and `session.fork(...)` open them from a snapshot.
   */
  constructor(internals: SessionInternals) {
    this.#http = internals.http;
    this.#maxBodyBytes = internals.maxBodyBytes;
    this.#opened = structuredClone(internals.info);
    this.#image = internals.image;
    this.#info = internals.info;
    this.#runs = runsOf(internals.info);
    this.#last = { sequence: internals.info.calls, record: internals.info.last_record_sha256 };
  }

  /** Its id (`ses_...`). */
  get id(): string {
    return this.#opened.session_id;
  }

  /**
   * The session as opened (or resumed), with its chain as this client last verified it
   * (`calls`, `last_record_sha256`), or as `refresh()` or `close()` last showed it: a new
   * object after each, never changed once handed out.
   */
  get info(): SessionInfo {
    return this.#info;
  }

  /** Runs `code` in the session's interpreter; resolves to the verified response. */
  cell(code: string, options: CellOptions = {}): Promise<RunResponse> {
    return this.#call(async (requestId) => {
      checked(requestId, () => {
        const o = only(options, "the cell options", ["restart", "timeoutMs", "onChunk", "signal"]);
        if (o.restart !== undefined && typeof o.restart !== "boolean") fail("restart must be a boolean");
      });
      const wire = this.#callRequest(requestId, options.timeoutMs, options.onChunk, () =>
        buildRun({ kind: "snippet", language: this.#opened.language, code }, true),
      );
      const query = options.restart === true ? "?restart=true" : "";
      return this.#post(`/cells${query}`, wire, requestId, "cell", options.onChunk, options.signal, options.timeoutMs);
    });
  }

  /**
   * Runs shell steps in order in the session's /work (`/bin/sh -c`, the first that fails
   * stops them), with `files` written first and `artifacts` read back after, if given.
   */
  steps(steps: readonly (string | Step)[], options: StepsOptions = {}): Promise<RunResponse> {
    return this.#call(async (requestId) => {
      checked(requestId, () => {
        only(options, "the steps options", ["timeoutMs", "onChunk", "files", "artifacts", "signal"]);
        if (!Array.isArray(steps)) fail("steps must be a list of commands");
      });
      const wire = this.#callRequest(requestId, options.timeoutMs, options.onChunk, () =>
        buildRun(
          {
            kind: "project",
            ...(options.files === undefined ? {} : { files: options.files }),
            steps: steps.map((s) => (typeof s === "string" ? { run: s } : s)),
            ...(options.artifacts === undefined ? {} : { artifacts: options.artifacts }),
          },
          true,
        ),
      );
      return this.#post("/steps", wire, requestId, "steps", options.onChunk, options.signal, options.timeoutMs);
    });
  }

  /** Writes `content` (exact bytes; a string is its UTF-8) to /work/`path` in the session. */
  put(path: string, content: Uint8Array | string, options: { signal?: AbortSignal } = {}): Promise<RunResponse> {
    return this.#call(async (requestId) => {
      const [p, bytes] = checked(requestId, () => {
        const p = projectPath(path, "path");
        if (typeof content === "string") return [p, utf8(text(content, "content"))] as const;
        if (!(content instanceof Uint8Array)) fail("content must be a Uint8Array or a string");
        return [p, content] as const;
      });
      if (bytes.byteLength > this.#maxBodyBytes) {
        throw new RequestTooLargeError(bytes.byteLength, this.#maxBodyBytes, requestId);
      }
      // What the daemon digests a file's PUT as (docs/sessions.md).
      const sent: RunRequest = {
        protocol: PROTOCOL,
        request_id: requestId,
        run: { kind: "project", files: [{ path: p, content: bytes, executable: false }], steps: [], artifacts: [] },
      };
      const answer = await this.#exchange("PUT", `/files/${urlPath(p)}`, requestId, {
        body: bytes,
        contentType: "application/octet-stream",
        signal: options.signal,
      });
      return this.#accept(sent, answer.status, answer.body, "file");
    });
  }

  /**
   * Reads /work/`path` from the session: `found`, `size`, the bytes (at most the artifact
   * limit: `truncated` says when the file was larger) and the verified call.
   */
  get(path: string, options: { signal?: AbortSignal } = {}): Promise<SessionFile> {
    return this.#call(async (requestId) => {
      const p = checked(requestId, () => projectPath(path, "path"));
      const sent: RunRequest = {
        protocol: PROTOCOL,
        request_id: requestId,
        run: { kind: "project", files: [], steps: [], artifacts: [p] },
      };
      const answer = await this.#exchange("GET", `/files/${urlPath(p)}`, requestId, { signal: options.signal });
      const response = this.#accept(sent, answer.status, answer.body, "file");
      const [artifact, ...more] = response.result.artifacts;
      if (artifact === undefined || more.length > 0 || artifact.path !== p) {
        throw new MayHaveRunError(
          "bad_response",
          `the code may have run: the answer to reading ${p} (request ${requestId}) holds ${response.result.artifacts.length} artifacts${artifact === undefined ? "" : `, the first ${JSON.stringify(artifact.path)}`}, not exactly that file`,
          requestId,
          { status: 200 },
        );
      }
      return { ...artifact, response };
    });
  }

  /**
   * Takes a snapshot of the session (docs/sessions.md, "Snapshots and forks"): its sandbox
   * saved with its interpreter's memory; the session goes on. Resolves to the snapshot once
   * its answer is checked: the echoed request id, this session, taken where its chain stands
   * as this client last verified it. `client.openSnapshot(snapshot)` opens a new session from
   * it.
   */
  snapshot(options: { signal?: AbortSignal } = {}): Promise<SnapshotInfo> {
    return this.#aside(async (requestId) => {
      const wire = { protocol: PROTOCOL, request_id: requestId };
      const path = `${sessionPath(this.id)}/snapshot`;
      const { status, body } = await postSmall(this.#http, this.#maxBodyBytes, path, wire, requestId, SNAPSHOT_MAY_HAVE, options.signal);
      if (status !== 200) throw refusal(requestId, status, body, SNAPSHOT_MAY_HAVE);
      const snap = readAnswer(body, readSnapshotInfo, (e) => badResponse(requestId, status, "not a snapshot", e, SNAPSHOT_MAY_HAVE));
      this.#checkSnapshot(snap, requestId, status, SNAPSHOT_MAY_HAVE);
      return snap;
    });
  }

  /**
   * Forks the session into `count` new sessions: a snapshot taken, then each copy opened from
   * it with fresh randomness. Resolves to the snapshot and the copies once the answer is
   * checked: the echoed request id, the snapshot as {@link Session.snapshot} checks it, and
   * each copy forked from this session at that snapshot, its chain going on from there (its
   * first call is the next sequence after the snapshot's `calls`). When a check fails, the
   * copies the answer names are closed again.
   */
  fork(count: number, options: { signal?: AbortSignal } = {}): Promise<Fork> {
    return this.#aside(async (requestId) => {
      const n = checked(requestId, () => {
        only(options, "the fork options", ["signal"]);
        const n = positive(count, "count");
        if (n > 0xffffffff) fail(`count must be at most 4294967295 (and the daemon's max_fork), not ${n}`);
        return n;
      });
      const wire = { protocol: PROTOCOL, request_id: requestId, count: n };
      const path = `${sessionPath(this.id)}/fork`;
      const { status, body } = await postSmall(this.#http, this.#maxBodyBytes, path, wire, requestId, FORK_MAY_HAVE, options.signal);
      if (status !== 200) throw refusal(requestId, status, body, FORK_MAY_HAVE);
      const answer = readAnswer(body, readForkAnswer, (e) => badResponse(requestId, status, "not a fork answer", e, FORK_MAY_HAVE));
      try {
        this.#checkFork(answer, n, requestId, status);
      } catch (e) {
        // Copies this client will not hand out are closed again (never this session); when
        // that fails too, both are kept.
        if (e instanceof MayHaveRunError) {
          const copies = answer.sessions.map((c) => c.session_id).filter((id) => id !== this.id && isSessionId(id));
          e.closeError = await closeAll(this.#http, [...new Set(copies)], options.signal);
        }
        throw e;
      }
      return {
        snapshot: answer.snapshot,
        sessions: answer.sessions.map((info) => new Session({ http: this.#http, maxBodyBytes: this.#maxBodyBytes, info, image: this.#image })),
      };
    });
  }

  /**
   * The session as the daemon shows it now (its calls, whether its interpreter is alive;
   * restored under its own id after a daemon restart, if it was). The chain stays where this
   * client verified it: the next call's record must still show a restore there.
   */
  refresh(options: { signal?: AbortSignal } = {}): Promise<SessionInfo> {
    return this.#serial(async () => (this.#info = await this.#show(options.signal)));
  }

  /**
   * After a call that may have run without an answer this client could verify, where the
   * chain stands is unknown and the session sends nothing more (`chain_in_doubt`, not
   * dispatched): `resync()` takes the daemon's word for it (`GET /v1/sessions/{id}`: its
   * calls and last record digest), and calls go on from there. A session the daemon shows
   * restored under its own id since (a daemon restart) is taken with its new origin, tier and
   * evidence.
   */
  resync(options: { signal?: AbortSignal } = {}): Promise<SessionInfo> {
    return this.#serial(async () => {
      const info = await this.#show(options.signal);
      if ((info.calls === 0) !== (info.last_record_sha256 === undefined)) {
        throw new SessionLookupError(
          "bad_response",
          `the daemon shows session ${this.id} with ${info.calls} calls and ${info.last_record_sha256 === undefined ? "no" : "a"} last record: a chain cannot stand so`,
          { status: 200 },
        );
      }
      this.#info = info;
      this.#runs = runsOf(info);
      this.#last = { sequence: info.calls, record: info.last_record_sha256 };
      this.#doubt = undefined;
      return info;
    });
  }

  /**
   * Closes the session: its sandbox is removed. Resolves to the session as it ended, its
   * `end_reason` `closed`. Calls after it are refused (`session_ended`, not dispatched).
   */
  close(options: { signal?: AbortSignal } = {}): Promise<SessionInfo> {
    return this.#serial(async () => (this.#info = await closeSession(this.#http, this.id, options.signal)));
  }

  /** Shows the session, never the token. */
  [inspect.custom](): string {
    return `Session { id: ${JSON.stringify(this.id)}, provider: ${JSON.stringify(this.#opened.provider)}, isolation: ${JSON.stringify(this.#runs.isolation)}, calls: ${this.#last.sequence} }`;
  }

  /** The session as shown: no token. */
  toJSON(): SessionInfo {
    return this.#info;
  }

  // -------------------------------------------------------------------------------------

  /**
   * The session as the daemon shows it, checked to be this one as it was opened and as it
   * runs now; or restored under its own id since (a daemon restart) after the last call this
   * client saw, then at a tier and evidence of the restoring daemon's, the tier still meeting
   * the session's floor.
   */
  async #show(signal: AbortSignal | undefined): Promise<SessionInfo> {
    const lookupId = newRequestId();
    const info = await showSession(this.#http, this.id, signal, lookupId);
    const restored = originDifference(this.#runs.origin, info.origin) !== undefined && restoredSince(info.origin, this.id, this.#last.sequence);
    const held = { ...this.#opened, ...this.#runs };
    const fields = ["session_id", "language", "provider", "minimum_isolation", "environment", ...(restored ? [] : (["isolation", "evidence_sha256"] as const))] as const;
    for (const field of fields) {
      if (info[field] !== held[field]) {
        throw new SessionLookupError(
          "bad_response",
          `the daemon shows session ${this.id} with ${field} ${info[field]}, not ${held[field]} as this client holds it: the answer was altered on the way or the daemon is faulty`,
          { status: 200 },
        );
      }
    }
    const shown = (i: SessionInfo): string => (i.image === undefined ? "none" : `${i.image.name} (${i.image.identity})`);
    if (shown(info) !== shown(this.#opened)) {
      throw new SessionLookupError(
        "bad_response",
        `the daemon shows session ${this.id} with image ${shown(info)}, not ${shown(this.#opened)} as when it was opened: the answer was altered on the way or the daemon is faulty`,
        { status: 200 },
      );
    }
    if (originDifference(this.#runs.origin, info.origin) !== undefined && !restored) {
      throw new SessionLookupError(
        "bad_response",
        `the daemon shows session ${this.id} with origin ${describeOrigin(info.origin) ?? "none"}, not ${describeOrigin(this.#runs.origin) ?? "none"} as this client holds it, nor restored under its own id after call ${this.#last.sequence}: the answer was altered on the way or the daemon is faulty`,
        { status: 200 },
      );
    }
    if (restored) {
      // Restored after `parent_calls` calls: its chain stands there or later.
      const o = info.origin!;
      if (info.calls < o.parent_calls || (info.calls === o.parent_calls && info.last_record_sha256 !== o.parent_record_sha256)) {
        throw new SessionLookupError(
          "bad_response",
          `the daemon shows session ${this.id} restored after call ${o.parent_calls} (record ${o.parent_record_sha256 ?? "none"}), yet at call ${info.calls} (record ${info.last_record_sha256 ?? "none"}): a chain cannot stand so`,
          { status: 200 },
        );
      }
      if (tierRank(info.isolation) < tierRank(this.#opened.minimum_isolation)) {
        throw new EvidenceMismatchError(info.provider, info.isolation, this.#opened.minimum_isolation, "session", lookupId);
      }
    }
    return info;
  }

  /**
   * The checks on a snapshot of this session (taken alone or by a fork): the echoed request
   * id, its shape, this session's, and taken where the chain stands as this client verified it.
   */
  #checkSnapshot(snap: SnapshotInfo, requestId: string, status: number, mayHave: string): void {
    if (snap.request_id !== requestId) {
      throw new MayHaveRunError(
        "request_id_mismatch",
        `${mayHave}: the snapshot echoes request id ${snap.request_id ?? "(none)"}, not ${requestId}; something between this client and the daemon mixed up answers`,
        requestId,
        { echoedRequestId: snap.request_id ?? null, status },
      );
    }
    checkSnapshotShape(snap, (what) => new MayHaveRunError("bad_response", `${mayHave}: ${what} (request ${requestId})`, requestId, { status }));
    const mismatch = (field: string, expected: string | undefined, found: string | undefined, why: string): never => {
      throw new SessionMismatchError(field, expected, found, requestId, why);
    };
    if (snap.session_id !== this.id) mismatch("session_id", this.id, snap.session_id, "the snapshot is another session's");
    const same = "the snapshot is of another sandbox than the session's";
    if (snap.language !== this.#opened.language) mismatch("language", this.#opened.language, snap.language, same);
    if (snap.provider !== this.#opened.provider) mismatch("provider", this.#opened.provider, snap.provider, same);
    if (snap.isolation !== this.#runs.isolation) mismatch("isolation", this.#runs.isolation, snap.isolation, same);
    const { sequence, record } = this.#last;
    const where = "the snapshot was not taken where this session's chain stands (a call missing, or made elsewhere)";
    if (snap.calls !== sequence) mismatch("calls", String(sequence), String(snap.calls), where);
    if (snap.last_record_sha256 !== record) mismatch("last_record_sha256", record, snap.last_record_sha256, where);
  }

  /**
   * The checks on a fork's answer: the echoed request id, the snapshot, and each copy: a new
   * session (its id its own), forked from this session at that snapshot, where this session
   * runs, in its image.
   */
  #checkFork(answer: ForkAnswer, count: number, requestId: string, status: number): void {
    const bad = (what: string): MayHaveRunError =>
      new MayHaveRunError("bad_response", `${FORK_MAY_HAVE}: ${what} (request ${requestId})`, requestId, { status });
    for (const echoed of [answer.request_id, ...answer.sessions.map((c) => c.request_id)]) {
      if (echoed !== undefined && echoed !== requestId) {
        throw new MayHaveRunError(
          "request_id_mismatch",
          `${FORK_MAY_HAVE}: the answer echoes request id ${echoed}, not ${requestId}; something between this client and the daemon mixed up answers, so these copies are not yours`,
          requestId,
          { echoedRequestId: echoed, status },
        );
      }
    }
    if (answer.protocol !== PROTOCOL) throw bad(`the answer speaks protocol ${answer.protocol}, this client protocol ${PROTOCOL}`);
    const snap = answer.snapshot;
    this.#checkSnapshot(snap, requestId, status, FORK_MAY_HAVE);
    if (answer.sessions.length !== count) throw bad(`the answer holds ${answer.sessions.length} copies, not the ${count} asked for`);
    const parent: CopyParent = {
      language: this.#opened.language,
      provider: this.#opened.provider,
      minimum_isolation: this.#opened.minimum_isolation,
    };
    const seen = new Set([this.id]);
    const image = (i: SessionInfo): string | undefined => (i.image === undefined ? undefined : `${i.image.name} (${i.image.identity})`);
    answer.sessions.forEach((copy, i) => {
      const what = `copy ${i + 1} of the fork (${copy.session_id})`;
      checkShown(copy, (w) => bad(`${what}: ${w}`));
      if (seen.has(copy.session_id)) throw bad(`${what} is named twice, or is the session forked: a copy is a new session`);
      seen.add(copy.session_id);
      checkCopy(
        copy,
        {
          start: "forked",
          snapshot_sha256: snap.sha256,
          parent_session_id: this.id,
          parent_record_sha256: snap.last_record_sha256,
          parent_calls: snap.calls,
        },
        parent,
        requestId,
        what,
        status,
        FORK_MAY_HAVE,
      );
      if (image(copy) !== image(this.#opened)) {
        throw new SessionMismatchError("image", image(this.#opened), image(copy), requestId, `${what}: a copy runs in its parent's image`);
      }
    });
  }

  /**
   * One call, in turn: refused here while the chain is in doubt; a call that may have run
   * without a verified answer puts it in doubt.
   */
  #call<T>(f: (requestId: string) => Promise<T>): Promise<T> {
    return this.#serial(async () => {
      const requestId = newRequestId();
      this.#refuseInDoubt(requestId);
      try {
        return await f(requestId);
      } catch (e) {
        if (e instanceof MayHaveRunError) {
          this.#doubt = `request ${requestId} may have run without an answer this client could verify (${e.code})`;
        }
        throw e;
      }
    });
  }

  /**
   * A request about the session that is no link of its chain (a snapshot, a fork), in turn:
   * refused here while the chain is in doubt, as its answer is checked against where the
   * chain stands; one that may have run leaves the chain where it was.
   */
  #aside<T>(f: (requestId: string) => Promise<T>): Promise<T> {
    return this.#serial(async () => {
      const requestId = newRequestId();
      this.#refuseInDoubt(requestId);
      return f(requestId);
    });
  }

  /** Refuses request `requestId`, unsent, while where the chain stands is unknown. */
  #refuseInDoubt(requestId: string): void {
    if (this.#doubt !== undefined) {
      throw new NotDispatchedError(
        "request",
        `where session ${this.id}'s chain stands is unknown since ${this.#doubt}, so this client sent nothing; call resync() to take the daemon's word for it, or open a new session`,
        requestId,
        "client",
        { code: "chain_in_doubt" },
      );
    }
  }

  /** Runs `f` after every call made before it has settled. */
  #serial<T>(f: () => Promise<T>): Promise<T> {
    const run = this.#queue.then(f, f);
    this.#queue = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  /** A cell's or steps call's JSON, checked; a malformed one is refused here, unsent. */
  #callRequest(
    requestId: string,
    timeoutMs: unknown,
    onChunk: unknown,
    run: () => Record<string, unknown>,
  ): Record<string, unknown> {
    return checked(requestId, () => {
      if (onChunk !== undefined && typeof onChunk !== "function") fail("onChunk must be a function");
      const wire: Record<string, unknown> = { protocol: PROTOCOL, request_id: requestId };
      if (timeoutMs !== undefined) wire.limits = { timeout_ms: positive(timeoutMs, "timeoutMs") };
      wire.run = run();
      return wire;
    });
  }

  /** One exchange with a path under this session's. */
  async #exchange(
    method: "GET" | "POST" | "PUT",
    sub: string,
    requestId: string,
    o: {
      body?: Uint8Array;
      contentType?: string;
      signal?: AbortSignal | undefined;
      budgetMs?: number;
      accept?: string;
      onLine?: (line: Uint8Array) => "more" | "done";
    },
  ): Promise<{ status: number; body: Uint8Array; streamed: boolean }> {
    const path = `${sessionPath(this.id)}${sub}`;
    try {
      return await this.#http.send(method, path, {
        ...(o.body === undefined ? {} : { body: o.body }),
        ...(o.contentType === undefined ? {} : { contentType: o.contentType }),
        // The request id in a header too: a refusal before the body is read (a bad token, an
        // over-size body) can then echo it.
        headers: { [REQUEST_ID_HEADER]: requestId, ...(o.accept === undefined ? {} : { accept: o.accept }) },
        budgetMs: o.budgetMs ?? DEFAULT_RUN_BUDGET_MS + EXCHANGE_SLACK_MS,
        signal: o.signal,
        ...(o.onLine === undefined ? {} : { onLine: o.onLine }),
      });
    } catch (e) {
      if (!(e instanceof ExchangeFailure)) throw e;
      throw exchangeError(e, `${this.#http.url}${path}`, requestId);
    }
  }

  /** Sends a cell or steps call, streamed when `onChunk` is given, and verifies its answer. */
  async #post(
    sub: string,
    wire: Record<string, unknown>,
    requestId: string,
    kind: "cell" | "steps",
    onChunk: ChunkHandler | undefined,
    signal: AbortSignal | undefined,
    timeoutMs: number | undefined,
  ): Promise<RunResponse> {
    const body = utf8(JSON.stringify(wire));
    if (body.byteLength > this.#maxBodyBytes) {
      throw new RequestTooLargeError(body.byteLength, this.#maxBodyBytes, requestId);
    }
    // Digests are recomputed over exactly the bytes that leave this process.
    let sent: RunRequest;
    try {
      sent = readRunRequest(parseJson(body));
    } catch (e) {
      throw new NotDispatchedError("request", `the request does not read back (${String(e)}); nothing was sent`, requestId, "client", {
        cause: e,
      });
    }
    let last: { response: RunResponse } | { error: ErrorResponse } | undefined;
    const onLine =
      onChunk === undefined
        ? undefined
        : (bytes: Uint8Array): "more" | "done" => {
            const line = readAnswer(bytes, readStreamLine, (e) =>
              badResponse(requestId, 200, `not a stream line (${preview(bytes)})`, e),
            );
            if ("chunk" in line) {
              try {
                onChunk(line.chunk);
              } catch (e) {
                throw new MayHaveRunError(
                  "transport",
                  `the code may have run: the onChunk handler threw (${describeError(e)}), so the answer to request ${requestId} was not read`,
                  requestId,
                  { cause: e },
                );
              }
              return "more";
            }
            last = line;
            return "done";
          };
    const answer = await this.#exchange("POST", sub, requestId, {
      body,
      signal,
      budgetMs: (timeoutMs ?? DEFAULT_RUN_BUDGET_MS) + EXCHANGE_SLACK_MS,
      ...(onLine === undefined ? {} : { accept: NDJSON, onLine }),
    });
    if (!answer.streamed) return this.#accept(sent, answer.status, answer.body, kind);
    // The stream's own status is 200 even when its last line is an error.
    const final = last as { response: RunResponse } | { error: ErrorResponse } | undefined;
    if (final === undefined) {
      throw new MayHaveRunError("transport", `the code may have run: the stream for request ${requestId} ended before its answer`, requestId);
    }
    if ("error" in final) throw refusalOf(requestId, 200, final.error);
    return this.#follow(sent, final.response, kind);
  }

  /** A whole answer to a call: verified and followed, or the error it means. */
  #accept(sent: RunRequest, status: number, body: Uint8Array, kind: "cell" | "steps" | "file"): RunResponse {
    if (status !== 200) throw refusal(sent.request_id, status, body);
    const response = readAnswer(body, readRunResponse, (e) => badResponse(sent.request_id, status, "not a run response", e));
    return this.#follow(sent, response, kind);
  }

  /**
   * Verifies a call's answer as a run's (its floor the session's), then checks its place in
   * the session's chain, and moves the chain on.
   */
  #follow(sent: RunRequest, response: RunResponse, kind: "cell" | "steps" | "file"): RunResponse {
    const id = sent.request_id;
    const floor: Floor = { tier: this.#opened.minimum_isolation, source: "session" };
    verifyResponse(sent, response, floor);
    const record = response.record;
    const link = record.session;
    const mismatch = (field: string, expected: string | undefined, found: string | undefined, why: string): never => {
      throw new SessionMismatchError(field, expected, found, id, why);
    };
    // Where the session runs, taken only once the whole answer is checked.
    let runs = this.#runs;
    if (link === undefined) {
      mismatch("session", this.id, undefined, "the record of a session call names no session");
    } else {
      if (link.session_id !== this.id) {
        mismatch("session_id", this.id, link.session_id, "the record is another session's");
      }
      const { sequence, record: previous } = this.#last;
      const why = "a call of this session is missing, repeated or reordered";
      if (link.sequence !== sequence + 1) mismatch("sequence", String(sequence + 1), String(link.sequence), why);
      if (link.previous_record_sha256 !== previous) {
        mismatch("previous_record_sha256", previous, link.previous_record_sha256, why);
      }
      // A restored or forked session's every record says where it came from, as the
      // session does; a session opened fresh, nothing. The one change taken: the session
      // restored under its own id by a daemon restart, said from the call right after its
      // last saved one, and from there at the restoring daemon's tier and evidence.
      const moved = originDifference(runs.origin, link.origin);
      if (moved !== undefined) {
        const restore = restoreBoundaryDifference(link.origin, this.id, link.sequence, previous);
        if (restore === undefined) {
          runs = { origin: link.origin, isolation: response.isolation, evidence_sha256: record.evidence_sha256 };
        } else if (link.origin?.start === "restored" && link.origin.parent_session_id === this.id) {
          mismatch(restore.field, restore.expected, restore.found, "the record says the session was restored under its own id, but not right after its last call");
        } else {
          mismatch(moved.field, moved.expected, moved.found, "the record says the session came from elsewhere than the session says");
        }
      }
    }
    const same = "the call ran elsewhere than the session (its provider and environment are fixed at open, its tier and evidence but across a daemon restart)";
    if (response.provider !== this.#opened.provider) mismatch("provider", this.#opened.provider, response.provider, same);
    if (response.isolation !== runs.isolation) mismatch("isolation", runs.isolation, response.isolation, same);
    if (record.evidence_sha256 !== runs.evidence_sha256) {
      mismatch("evidence_sha256", runs.evidence_sha256, record.evidence_sha256, same);
    }
    if (record.environment !== this.#opened.environment) mismatch("environment", this.#opened.environment, record.environment, same);
    // The image the open named, like the session's floor: every call's record must name it.
    if (this.#image !== undefined) checkImage(this.#image, record.image, id, "the session call");
    // What the types cannot say: only a cell says whether its interpreter's state was kept,
    // always, and an interpreter that ended kept none.
    const { state_kept: kept, interpreter_end: end } = response.result;
    const malformed = (what: string): never => {
      throw new MayHaveRunError(
        "bad_response",
        `the code may have run: the result for request ${id} is malformed: ${what}`,
        id,
        { status: 200 },
      );
    };
    if (kind === "cell") {
      if (kept === undefined) malformed("a cell's result says nothing of `state_kept`");
      if (end !== undefined && kept === true) malformed(`its interpreter ended (${end}) yet \`state_kept\` is true`);
      if (end !== undefined && !INTERPRETER_ENDS.includes(end)) malformed(`\`interpreter_end\` is ${end}, which ends a session, not an interpreter`);
    } else if (kept !== undefined || end !== undefined) {
      malformed("only a cell's result has `state_kept` or `interpreter_end`");
    }
    this.#last = { sequence: link!.sequence, record: record.record_sha256 };
    // A new object: an info handed out earlier stays what it was.
    this.#info = {
      ...this.#info,
      ...(runs === this.#runs ? {} : runs),
      calls: link!.sequence,
      last_record_sha256: record.record_sha256,
      ...(kind === "cell" ? { interpreter_alive: end === undefined } : {}),
    };
    this.#runs = runs;
    return response;
  }
}

/** Where a session shown as `info` runs: its origin, tier and evidence. */
function runsOf(info: SessionInfo): Pick<SessionInfo, "origin" | "isolation" | "evidence_sha256"> {
  return { origin: info.origin, isolation: info.isolation, evidence_sha256: info.evidence_sha256 };
}

/** Runs `f`; a request it finds malformed is refused, not dispatched, nothing sent. */
function checked<T>(requestId: string, f: () => T): T {
  try {
    return f();
  } catch (e) {
    if (e instanceof RequestShapeError) {
      throw new NotDispatchedError("request", `${e.message}; nothing was sent`, requestId, "client", { cause: e });
    }
    throw e;
  }
}

/** `DELETE /v1/sessions/{id}`, its answer checked: this session, ended `closed`. */
async function closeSession(http: Http, id: string, signal: AbortSignal | undefined): Promise<SessionInfo> {
  const requestId = newRequestId();
  const path = sessionPath(id);
  let answer: { status: number; body: Uint8Array };
  try {
    answer = await http.send("DELETE", path, {
      headers: { [REQUEST_ID_HEADER]: requestId },
      budgetMs: EXCHANGE_SLACK_MS,
      signal,
    });
  } catch (e) {
    if (!(e instanceof ExchangeFailure)) throw e;
    throw exchangeError(e, `${http.url}${path}`, requestId, CLOSE_MAY_HAVE);
  }
  const { status, body } = answer;
  if (status !== 200) throw refusal(requestId, status, body, CLOSE_MAY_HAVE);
  const info = readAnswer(body, readSessionInfo, (e) => badResponse(requestId, status, "not a session", e, CLOSE_MAY_HAVE));
  if (info.request_id !== requestId) {
    throw new MayHaveRunError(
      "request_id_mismatch",
      `${CLOSE_MAY_HAVE}: the answer echoes request id ${info.request_id ?? "(none)"}, not ${requestId}; something between this client and the daemon mixed up answers`,
      requestId,
      { echoedRequestId: info.request_id ?? null, status },
    );
  }
  if (info.session_id !== id) {
    throw new SessionMismatchError("session_id", id, info.session_id, requestId, "the close answered for another session");
  }
  if (info.end_reason !== "closed") {
    throw new MayHaveRunError(
      "bad_response",
      `${CLOSE_MAY_HAVE}: the close (request ${requestId}) answered end reason ${info.end_reason ?? "(none)"}, not closed`,
      requestId,
      { status },
    );
  }
  return info;
}

/** Closes each of `ids`: `undefined` when all closed, else the error (all of them, when several). */
async function closeAll(http: Http, ids: readonly string[], signal: AbortSignal | undefined): Promise<unknown> {
  const failed: unknown[] = [];
  for (const id of ids) {
    try {
      await closeSession(http, id, signal);
    } catch (e) {
      failed.push(e);
    }
  }
  if (failed.length === 0) return undefined;
  return failed.length === 1 ? failed[0] : new AggregateError(failed, `${failed.length} of ${ids.length} sessions were not closed`);
}

/**
 * `POST`s a small JSON body (a snapshot, a fork, an open from a snapshot), its request id in
 * a header too, so a refusal before the body is read can echo it.
 */
async function postSmall(
  http: Http,
  maxBodyBytes: number,
  path: string,
  wire: Record<string, unknown>,
  requestId: string,
  mayHave: string,
  signal: AbortSignal | undefined,
): Promise<{ status: number; body: Uint8Array }> {
  const body = utf8(JSON.stringify(wire));
  if (body.byteLength > maxBodyBytes) throw new RequestTooLargeError(body.byteLength, maxBodyBytes, requestId);
  try {
    const answer = await http.send("POST", path, {
      body,
      headers: { [REQUEST_ID_HEADER]: requestId },
      budgetMs: EXCHANGE_SLACK_MS,
      signal,
    });
    return { status: answer.status, body: answer.body };
  } catch (e) {
    if (!(e instanceof ExchangeFailure)) throw e;
    throw exchangeError(e, `${http.url}${path}`, requestId, mayHave);
  }
}

function sessionPath(id: string): string {
  return `/v1/sessions/${encodeURIComponent(id)}`;
}

function snapshotPath(id: string): string {
  return `/v1/snapshots/${encodeURIComponent(id)}`;
}

/** A /work path as URL path segments, each percent-encoded. */
function urlPath(path: string): string {
  return path.split("/").map(encodeURIComponent).join("/");
}

// ---------------------------------------------------------------------------------------
// Opening, resuming, listing (the client's methods call these).

/** `client.openSession(options)`. */
export async function openSession(
  http: Http,
  maxBodyBytes: number,
  options: SessionOptions,
  defaultFloor: () => Promise<Tier>,
): Promise<Session> {
  const requestId = newRequestId();
  const wire = checked(requestId, () => {
    const o = only(options, "the session options", [
      "language",
      "minimum_isolation",
      "provider",
      "grant",
      "limits",
      "idle_timeout_ms",
      "max_lifetime_ms",
      "image",
      "signal",
    ]);
    if (o.language !== "javascript" && o.language !== "python") {
      fail(`language must be \`javascript\` or \`python\`, not ${JSON.stringify(o.language)}`);
    }
    const wire: Record<string, unknown> = { protocol: PROTOCOL, request_id: requestId, language: o.language };
    if (o.minimum_isolation !== undefined) wire.minimum_isolation = tier(o.minimum_isolation, "minimum_isolation");
    if (o.provider !== undefined) wire.provider = provider(o.provider);
    if (o.grant !== undefined) {
      if (text(o.grant, "grant") === "") fail("grant must not be empty: omit it for a session without grants");
      wire.grant = o.grant;
    }
    if (o.limits !== undefined) wire.limits = buildLimits(o.limits);
    if (o.idle_timeout_ms !== undefined) wire.idle_timeout_ms = positive(o.idle_timeout_ms, "idle_timeout_ms");
    if (o.max_lifetime_ms !== undefined) wire.max_lifetime_ms = positive(o.max_lifetime_ms, "max_lifetime_ms");
    if (o.image !== undefined) wire.image = image(o.image);
    return wire;
  });
  const body = utf8(JSON.stringify(wire));
  if (body.byteLength > maxBodyBytes) throw new RequestTooLargeError(body.byteLength, maxBodyBytes, requestId);

  let floor: Floor;
  if (options.minimum_isolation !== undefined) {
    floor = { tier: options.minimum_isolation, source: "request" };
  } else {
    try {
      floor = { tier: await defaultFloor(), source: "daemon_default" };
    } catch (e) {
      const reason = e instanceof ProvidersError && e.reason !== undefined ? e.reason : "environment";
      throw new NotDispatchedError(
        reason,
        `no floor was set and this client could not learn the daemon's default floor, so it opened nothing (${describeError(e)}); set minimum_isolation, or fix what the message says`,
        requestId,
        "client",
        { cause: e },
      );
    }
  }

  const path = "/v1/sessions";
  let status: number;
  let answer: Uint8Array;
  try {
    ({ status, body: answer } = await http.send("POST", path, {
      body,
      headers: { [REQUEST_ID_HEADER]: requestId },
      budgetMs: EXCHANGE_SLACK_MS,
      signal: options.signal,
    }));
  } catch (e) {
    if (!(e instanceof ExchangeFailure)) throw e;
    throw exchangeError(e, `${http.url}${path}`, requestId, OPEN_MAY_HAVE);
  }
  if (status !== 200) throw refusal(requestId, status, answer, OPEN_MAY_HAVE);
  const info = readAnswer(answer, readSessionInfo, (e) => badResponse(requestId, status, "not a session", e, OPEN_MAY_HAVE));
  if (info.request_id !== requestId) {
    throw new MayHaveRunError(
      "request_id_mismatch",
      `${OPEN_MAY_HAVE}: the answer echoes request id ${info.request_id ?? "(none)"}, not ${requestId}; something between this client and the daemon mixed up answers, so this session is not yours`,
      requestId,
      { echoedRequestId: info.request_id ?? null, status },
    );
  }
  checkShown(info, (what) => new MayHaveRunError("bad_response", `${OPEN_MAY_HAVE}: ${what} (request ${requestId})`, requestId, { status }));
  try {
    checkOpened(info, options, floor, requestId, status);
  } catch (e) {
    // A session this client will not hand out is closed again; if that fails too, both
    // errors are kept.
    if (e instanceof MayHaveRunError) {
      try {
        await closeSession(http, info.session_id, options.signal);
      } catch (c) {
        e.closeError = c;
      }
    }
    throw e;
  }
  return new Session({ http, maxBodyBytes, info, image: options.image });
}

/** The checks on a session just opened, its id echoed and well formed. */
function checkOpened(info: SessionInfo, options: SessionOptions, floor: Floor, requestId: string, status: number): void {
  if (info.end_reason !== undefined || info.calls !== 0 || info.last_record_sha256 !== undefined) {
    throw new MayHaveRunError(
      "bad_response",
      `${OPEN_MAY_HAVE}: the answer to opening it shows a session that is not new (calls ${info.calls}, end reason ${info.end_reason ?? "none"}) (request ${requestId})`,
      requestId,
      { status },
    );
  }
  if (info.language !== options.language) {
    throw new SessionMismatchError("language", options.language, info.language, requestId, "the session opened is not the one asked for");
  }
  // The tier against the floor held, and against the floor the daemon says it applied,
  // which must be that floor.
  if (tierRank(info.isolation) < tierRank(floor.tier)) {
    throw new EvidenceMismatchError(info.provider, info.isolation, floor.tier, floor.source, requestId);
  }
  if (tierRank(info.isolation) < tierRank(info.minimum_isolation)) {
    throw new EvidenceMismatchError(info.provider, info.isolation, info.minimum_isolation, "session", requestId);
  }
  if (info.minimum_isolation !== floor.tier) {
    throw new SessionMismatchError(
      "minimum_isolation",
      floor.tier,
      info.minimum_isolation,
      requestId,
      floor.source === "request" ? "the daemon holds the session to another floor than the one sent" : "the daemon holds the session to another floor than its default floor",
    );
  }
  if (options.provider !== undefined && info.provider !== options.provider) {
    throw new ProviderMismatchError(options.provider, info.provider, requestId);
  }
  if (options.image !== undefined) checkImage(options.image, info.image, requestId, "the session");
}

/** `client.session(id)`. */
export async function resumeSession(
  http: Http,
  maxBodyBytes: number,
  id: string,
  options: { minimum_isolation?: Tier; signal?: AbortSignal },
): Promise<Session> {
  if (typeof id !== "string" || !isSessionId(id)) {
    throw new SessionLookupError("request", `not a session id: ${JSON.stringify(id)} (\`ses_\`, 16 hex digits, \`_\`, 32 hex digits); nothing was sent`);
  }
  if (options.minimum_isolation !== undefined && !(TIERS as readonly unknown[]).includes(options.minimum_isolation)) {
    throw new SessionLookupError("request", `minimum_isolation must be one of ${TIERS.join(", ")}, not ${JSON.stringify(options.minimum_isolation)}; nothing was sent`);
  }
  // A lookup runs nothing; its id is for the errors that name one.
  const lookupId = newRequestId();
  const info = await showSession(http, id, options.signal, lookupId);
  if (info.session_id !== id) {
    throw new SessionLookupError("bad_response", `the daemon answered for session ${info.session_id}, not ${id}`, { status: 200 });
  }
  if ((info.calls === 0) !== (info.last_record_sha256 === undefined)) {
    throw new SessionLookupError(
      "bad_response",
      `the daemon shows session ${id} with ${info.calls} calls and ${info.last_record_sha256 === undefined ? "no" : "a"} last record: a chain cannot stand so`,
      { status: 200 },
    );
  }
  if (tierRank(info.isolation) < tierRank(info.minimum_isolation)) {
    throw new EvidenceMismatchError(info.provider, info.isolation, info.minimum_isolation, "session", lookupId);
  }
  if (options.minimum_isolation !== undefined && tierRank(info.isolation) < tierRank(options.minimum_isolation)) {
    throw new EvidenceMismatchError(info.provider, info.isolation, options.minimum_isolation, "request", lookupId);
  }
  return new Session({ http, maxBodyBytes, info });
}

/** `GET /v1/sessions/{id}`, read strictly. */
async function showSession(http: Http, id: string, signal: AbortSignal | undefined, requestId = newRequestId()): Promise<SessionInfo> {
  const info = await lookup(http, sessionPath(id), readSessionInfo, "a session", signal, requestId);
  checkShown(info, (what) => new SessionLookupError("bad_response", `${what} (session ${id})`, { status: 200 }));
  return info;
}

/** `client.listSessions()`. */
export async function listSessions(http: Http, options: { signal?: AbortSignal }): Promise<SessionList> {
  const list = await lookup(http, "/v1/sessions", readSessionList, "a session list", options.signal, newRequestId());
  if (list.protocol !== PROTOCOL) {
    throw new SessionLookupError("bad_response", `the session list speaks protocol ${list.protocol}, this client protocol ${PROTOCOL}`, { status: 200 });
  }
  for (const info of list.sessions) {
    checkShown(info, (what) => new SessionLookupError("bad_response", `${what} (in the session list)`, { status: 200 }));
  }
  return list;
}

// ---------------------------------------------------------------------------------------
// Snapshots (docs/sessions.md, "Snapshots and forks"); `session.snapshot()` takes one.

/** The id of a snapshot given as an id or a `SnapshotInfo`; a malformed one refused unsent. */
function snapshotIdOf(snapshot: string | SnapshotInfo): string {
  const id: unknown = typeof snapshot === "string" ? snapshot : (snapshot as SnapshotInfo | undefined)?.snapshot_id;
  if (typeof id !== "string" || !isSnapshotId(id)) {
    fail(`not a snapshot id: ${JSON.stringify(id)} (\`snp_\`, 16 hex digits, \`_\`, 32 hex digits)`);
  }
  return id;
}

/** `client.openSnapshot(snapshot, options)`. */
export async function openSnapshot(
  http: Http,
  maxBodyBytes: number,
  snapshot: string | SnapshotInfo,
  options: SnapshotOpenOptions,
): Promise<Session> {
  const requestId = newRequestId();
  // Given a SnapshotInfo, the client knows the snapshot: the session must come from it.
  const known = typeof snapshot === "string" ? undefined : snapshot;
  const { id, sha256 } = checked(requestId, () => {
    const o = only(options, "the snapshot open options", ["sha256", "minimum_isolation", "signal"]);
    const id = snapshotIdOf(snapshot);
    if (o.sha256 !== undefined && (typeof o.sha256 !== "string" || !/^[0-9a-f]{64}$/.test(o.sha256))) {
      fail(`sha256 must be 64 lowercase hex digits (a snapshot's \`sha256\`), not ${JSON.stringify(o.sha256)}`);
    }
    if (o.sha256 !== undefined && known !== undefined && o.sha256 !== known.sha256) {
      fail(`sha256 ${String(o.sha256)} is not the digest of the snapshot given (${known.sha256}): give one or the other`);
    }
    if (o.minimum_isolation !== undefined) tier(o.minimum_isolation, "minimum_isolation");
    return { id, sha256: (o.sha256 as string | undefined) ?? known?.sha256 };
  });
  const wire: Record<string, unknown> = { protocol: PROTOCOL, request_id: requestId };
  if (sha256 !== undefined) wire.sha256 = sha256;
  const { status, body } = await postSmall(http, maxBodyBytes, `${snapshotPath(id)}/sessions`, wire, requestId, OPEN_MAY_HAVE, options.signal);
  if (status !== 200) throw refusal(requestId, status, body, OPEN_MAY_HAVE);
  const info = readAnswer(body, readSessionInfo, (e) => badResponse(requestId, status, "not a session", e, OPEN_MAY_HAVE));
  if (info.request_id !== requestId) {
    throw new MayHaveRunError(
      "request_id_mismatch",
      `${OPEN_MAY_HAVE}: the answer echoes request id ${info.request_id ?? "(none)"}, not ${requestId}; something between this client and the daemon mixed up answers, so this session is not yours`,
      requestId,
      { echoedRequestId: info.request_id ?? null, status },
    );
  }
  checkShown(info, (what) => new MayHaveRunError("bad_response", `${OPEN_MAY_HAVE}: ${what} (request ${requestId})`, requestId, { status }));
  try {
    checkCopy(
      info,
      {
        start: "restored",
        ...(sha256 === undefined ? {} : { snapshot_sha256: sha256 }),
        ...(known === undefined
          ? {}
          : { parent_session_id: known.session_id, parent_record_sha256: known.last_record_sha256, parent_calls: known.calls }),
      },
      known === undefined ? undefined : { language: known.language, provider: known.provider },
      requestId,
      `the session restored from ${id}`,
      status,
      OPEN_MAY_HAVE,
    );
    if (options.minimum_isolation !== undefined && tierRank(info.isolation) < tierRank(options.minimum_isolation)) {
      throw new EvidenceMismatchError(info.provider, info.isolation, options.minimum_isolation, "request", requestId);
    }
  } catch (e) {
    // As for an open: a session this client will not hand out is closed again.
    if (e instanceof MayHaveRunError) {
      try {
        await closeSession(http, info.session_id, options.signal);
      } catch (c) {
        e.closeError = c;
      }
    }
    throw e;
  }
  return new Session({ http, maxBodyBytes, info });
}

/** `client.listSnapshots()`: a lookup, running nothing. */
export async function listSnapshots(http: Http, options: { signal?: AbortSignal }): Promise<SnapshotList> {
  const list = await lookup(http, "/v1/snapshots", readSnapshotList, "a snapshot list", options.signal, newRequestId());
  if (list.protocol !== PROTOCOL) {
    throw new SessionLookupError("bad_response", `the snapshot list speaks protocol ${list.protocol}, this client protocol ${PROTOCOL}`, { status: 200 });
  }
  for (const snap of list.snapshots) {
    checkSnapshotShape(snap, (what) => new SessionLookupError("bad_response", `${what} (in the snapshot list)`, { status: 200 }));
  }
  return list;
}

/** `client.deleteSnapshot(snapshot)`: `DELETE /v1/snapshots/{id}`, its answer checked: this snapshot. */
export async function deleteSnapshot(http: Http, snapshot: string | SnapshotInfo, options: { signal?: AbortSignal }): Promise<SnapshotInfo> {
  const requestId = newRequestId();
  const id = checked(requestId, () => snapshotIdOf(snapshot));
  const path = snapshotPath(id);
  let answer: { status: number; body: Uint8Array };
  try {
    answer = await http.send("DELETE", path, {
      headers: { [REQUEST_ID_HEADER]: requestId },
      budgetMs: EXCHANGE_SLACK_MS,
      signal: options.signal,
    });
  } catch (e) {
    if (!(e instanceof ExchangeFailure)) throw e;
    throw exchangeError(e, `${http.url}${path}`, requestId, DELETE_MAY_HAVE);
  }
  const { status, body } = answer;
  if (status !== 200) throw refusal(requestId, status, body, DELETE_MAY_HAVE);
  const info = readAnswer(body, readSnapshotInfo, (e) => badResponse(requestId, status, "not a snapshot", e, DELETE_MAY_HAVE));
  if (info.request_id !== requestId) {
    throw new MayHaveRunError(
      "request_id_mismatch",
      `${DELETE_MAY_HAVE}: the answer echoes request id ${info.request_id ?? "(none)"}, not ${requestId}; something between this client and the daemon mixed up answers`,
      requestId,
      { echoedRequestId: info.request_id ?? null, status },
    );
  }
  const bad = (what: string): MayHaveRunError => new MayHaveRunError("bad_response", `${DELETE_MAY_HAVE}: ${what} (request ${requestId})`, requestId, { status });
  checkSnapshotShape(info, bad);
  const known = typeof snapshot === "string" ? undefined : snapshot;
  for (const [field, want, found] of [
    ["snapshot_id", id, info.snapshot_id],
    ["sha256", known?.sha256, info.sha256],
    ["session_id", known?.session_id, info.session_id],
  ] as const) {
    if (want !== undefined && found !== want) throw bad(`the delete answered for a snapshot with ${field} ${found}, not ${want}`);
  }
  return info;
}

/** The checks any session answer must pass: its protocol and its id's shape. */
function checkShown(info: SessionInfo, bad: (what: string) => Error): void {
  if (info.protocol !== PROTOCOL) throw bad(`the answer speaks protocol ${info.protocol}, this client protocol ${PROTOCOL}`);
  if (!isSessionId(info.session_id)) throw bad(`${JSON.stringify(info.session_id)} is not a session id`);
}

/** A lookup that runs nothing: its failures are {@link SessionLookupError}s. */
async function lookup<T>(
  http: Http,
  path: string,
  read: (v: JsonValue) => T,
  what: string,
  signal: AbortSignal | undefined,
  requestId: string,
): Promise<T> {
  const url = `${http.url}${path}`;
  let status: number;
  let body: Uint8Array;
  try {
    ({ status, body } = await http.send("GET", path, { headers: { [REQUEST_ID_HEADER]: requestId }, budgetMs: LOOKUP_BUDGET_MS, signal }));
  } catch (e) {
    if (!(e instanceof ExchangeFailure)) throw e;
    if (!e.maySent) throw new SessionLookupError("unreachable", unreachable(url, e), { cause: e.cause });
    throw new SessionLookupError("transport", `the exchange with ${url} failed: ${e.message}`, { cause: e.cause });
  }
  const bad = (about: string, cause: unknown): SessionLookupError =>
    new SessionLookupError("bad_response", `unreadable answer from ${url} (HTTP ${status}): ${about}: ${describeError(cause)}`, { status, cause });
  const parse = <U>(r: (v: JsonValue) => U, about: string): U => {
    try {
      return r(parseJson(body));
    } catch (e) {
      if (e instanceof JsonSyntaxError || e instanceof ShapeError) throw bad(about, e);
      throw e;
    }
  };
  if (status !== 200) {
    const answer = parse(readErrorResponse, `not an error response (${preview(body)})`);
    throw new SessionLookupError(
      "refused",
      `the daemon at ${url} answered HTTP ${status} (${answer.error.code}${answer.error.end_reason === undefined ? "" : `, ended: ${answer.error.end_reason}`}): ${answer.error.message}`,
      {
        status,
        code: answer.error.code,
        reason: answer.error.not_dispatched ?? undefined,
        endReason: answer.error.end_reason,
      },
    );
  }
  return parse(read, `not ${what}`);
}
