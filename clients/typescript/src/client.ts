/**
 * The client of one plimsolld: sends each run with a fresh request id, honours a "not
 * dispatched" mark only when the answer echoes that id, recomputes the request, result and
 * record digests, and re-checks the tier against the floor (the one sent, or the daemon's
 * default floor) and the provider and the image against the ones named.
 * @module
 */

import { inspect } from "node:util";

import { RequestShapeError, buildRequest } from "./build.js";
import { utf8 } from "./bytes.js";
import { evidenceSha256 } from "./digest.js";
import {
  type ImageMismatchError,
  MayHaveRunError,
  NotDispatchedError,
  ProvidersError,
  RequestTooLargeError,
} from "./errors.js";
import {
  DEFAULT_RUN_BUDGET_MS,
  EXCHANGE_SLACK_MS,
  ExchangeFailure,
  Http,
  LOOKUP_BUDGET_MS,
  badResponse,
  describeError,
  exchangeError,
  newRequestId,
  preview,
  readAnswer,
  refusal,
  unreachable,
} from "./http.js";
import { parseJson } from "./json.js";
import { readErrorResponse, readProvidersResponse, readRunRequest, readRunResponse } from "./read.js";
import {
  Session,
  type SessionOptions,
  type SnapshotOpenOptions,
  deleteSnapshot,
  listSessions,
  listSnapshots,
  openSession,
  openSnapshot,
  resumeSession,
} from "./session.js";
import { type TrialSpec, trialProject } from "./trial.js";
import {
  type Language,
  type Limits,
  PROTOCOL,
  type Project,
  type ProvidersResponse,
  type RunRequest,
  type RunResponse,
  type RunSpec,
  type SessionList,
  type SnapshotInfo,
  type SnapshotList,
  type Tier,
} from "./types.js";
import { type Floor, verifyResponse } from "./verify.js";

/** The largest request body sent unless told otherwise: the daemon's default `max_body_bytes`. */
export const DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024;
/** The largest answer read unless told otherwise (outputs and artifacts can be large). */
export const DEFAULT_MAX_ANSWER_BYTES = 1024 * 1024 * 1024;

export { newRequestId };

/** How to reach one daemon. */
export interface ClientOptions {
  /** The daemon's base URL, e.g. `http://127.0.0.1:7878`. */
  url: string;
  /**
   * A caller token (`plm_...`), sent in the `Authorization` header and nowhere else. Required:
   * `undefined` (an unset `process.env.PLIMSOLL_TOKEN`) throws a `TypeError` saying so.
   */
  token: string | undefined;
  /**
   * The largest request body to send (default 8 MiB, the daemon's default `max_body_bytes`):
   * set it to the daemon's when that differs. A larger request is refused here, unsent.
   */
  maxBodyBytes?: number;
  /** The largest answer to read (default 1 GiB); a larger one is a {@link MayHaveRunError}. */
  maxAnswerBytes?: number;
}

/** What to run, under which floor; the client adds the protocol and a fresh request id. */
export interface RunOptions {
  /** What to run. */
  run: RunSpec;
  /**
   * The floor: the weakest tier to accept. Absent: the daemon's default floor, which this
   * client learns once from `GET /v1/providers` and checks the result against.
   */
  minimum_isolation?: Tier;
  /** Run on this provider only. */
  provider?: string;
  /** Limits to ask for. */
  limits?: Limits;
  /** The name of a grant profile the operator defined. */
  grant?: string;
  /**
   * The image to run in: an image name (`python-data`) or identity (`sha256:...`). Absent: the
   * operator's default image. The record must name it, or the run fails with an
   * {@link ImageMismatchError} (the code ran).
   */
  image?: string;
  /** Aborts the exchange: a {@link MayHaveRunError} (`transport`), as the request may have left. */
  signal?: AbortSignal;
}

/** Options of a run whose `run` is given separately. */
export type RunSettings = Omit<RunOptions, "run">;

/** A trial and the settings of its run (a trial takes no grant). */
export type TrialOptions = TrialSpec & Omit<RunSettings, "grant">;

/** A verified exchange: the request exactly as sent, and the verified answer. */
export interface Exchange {
  /** The request as sent, read back from its bytes. */
  request: RunRequest;
  /** The bytes sent. */
  requestBody: Uint8Array;
  /** The verified answer. */
  response: RunResponse;
  /** The answer's bytes as received. */
  responseBody: Uint8Array;
  /** The floor the result was checked against. */
  floor: Floor;
}

/** A client of one daemon. Holds no connection between calls: each exchange opens its own. */
export class Client {
  readonly #url: string;
  readonly #http: Http;
  readonly #maxBodyBytes: number;
  #defaultFloor: Promise<Tier> | undefined;

  constructor(options: ClientOptions) {
    let url: URL;
    try {
      url = new URL(options.url);
    } catch {
      throw new TypeError(`not a URL: ${JSON.stringify(options.url)}: give the daemon's base URL, e.g. http://127.0.0.1:7878`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new TypeError(`the daemon's URL must be http or https, not ${url.protocol}`);
    }
    if (typeof options.token !== "string" || options.token === "") {
      throw new TypeError("a caller token is needed: `plimsoll callers add NAME` prints one (e.g. set PLIMSOLL_TOKEN)");
    }
    this.#url = options.url.replace(/\/+$/, "");
    this.#maxBodyBytes = positive(options.maxBodyBytes, DEFAULT_MAX_BODY_BYTES, "maxBodyBytes");
    this.#http = new Http(
      this.#url,
      options.token,
      positive(options.maxAnswerBytes, DEFAULT_MAX_ANSWER_BYTES, "maxAnswerBytes"),
    );
  }

  /** The daemon's base URL. */
  get url(): string {
    return this.#url;
  }

  /** The largest request body this client sends. */
  get maxBodyBytes(): number {
    return this.#maxBodyBytes;
  }

  /** Runs a request and verifies its answer; resolves once the run is over. */
  async run(options: RunOptions): Promise<RunResponse> {
    return (await this.exchange(options)).response;
  }

  /** Runs a snippet. */
  runSnippet(language: Language, code: string, settings: RunSettings = {}): Promise<RunResponse> {
    return this.run({ ...settings, run: { kind: "snippet", language, code } });
  }

  /** Runs JavaScript (node). */
  runJavaScript(code: string, settings: RunSettings = {}): Promise<RunResponse> {
    return this.runSnippet("javascript", code, settings);
  }

  /** Runs Python (python3). */
  runPython(code: string, settings: RunSettings = {}): Promise<RunResponse> {
    return this.runSnippet("python", code, settings);
  }

  /** Runs a project: files written under /work, shell steps in order, artifacts returned. */
  runProject(project: Omit<Project, "kind">, settings: RunSettings = {}): Promise<RunResponse> {
    return this.run({ ...settings, run: { kind: "project", ...project } });
  }

  /**
   * Examines a controller against a simulator the run's image declares, on scenarios
   * (docs/simulators.md), as `plimsoll trial` does: one project of one trial step
   * ({@link trialProject}). Resolves to the verified response: `record.trials[0]` is the
   * verdict (the simulator's name, version and SHA-256, each trial's end, reason, ticks,
   * score and fingerprint), and the trajectories are `result.artifacts`, in the scenarios'
   * order. A name the runner could not take, two files of one name or a controller in another
   * language is refused here, unsent (a {@link NotDispatchedError}, reason `request`); a
   * simulator the image does not declare is refused by the daemon (reason `environment`).
   */
  async trial(options: TrialOptions): Promise<RunResponse> {
    const { simulator, simulator_sha256, controller, scenarios, first_deadline_ms, tick_deadline_ms, reproducible, ...settings } =
      options;
    let run: Project;
    try {
      run = trialProject({ simulator, simulator_sha256, controller, scenarios, first_deadline_ms, tick_deadline_ms, reproducible });
    } catch (e) {
      if (e instanceof RequestShapeError) {
        throw new NotDispatchedError("request", `${e.message}; nothing was sent`, undefined, "client", { cause: e });
      }
      throw e;
    }
    return this.run({ ...settings, run });
  }

  /** Like {@link Client.run}, also giving the request as sent and the bytes of both sides. */
  async exchange(options: RunOptions): Promise<Exchange> {
    const requestId = newRequestId();
    const refuse = (message: string, cause?: unknown): NotDispatchedError =>
      new NotDispatchedError("request", message, requestId, "client", { cause });

    let wire: Record<string, unknown>;
    try {
      wire = buildRequest(options, requestId);
    } catch (e) {
      if (e instanceof RequestShapeError) {
        throw refuse(`${e.message}; nothing was sent`);
      }
      throw e;
    }
    const requestBody = utf8(JSON.stringify(wire));
    // Over the daemon's limit it would be refused after being sent, and that refusal may
    // arrive as a closed connection ("may have run"): refuse it here, sending nothing.
    if (requestBody.byteLength > this.#maxBodyBytes) {
      throw new RequestTooLargeError(requestBody.byteLength, this.#maxBodyBytes, requestId);
    }
    // Digests are recomputed over exactly the bytes that leave this process.
    let sent: RunRequest;
    try {
      sent = readRunRequest(parseJson(requestBody));
    } catch (e) {
      throw refuse(`the request does not read back (${String(e)}); nothing was sent`, e);
    }

    let floor: Floor;
    if (sent.minimum_isolation !== undefined) {
      floor = { tier: sent.minimum_isolation, source: "request" };
    } else {
      try {
        floor = { tier: await this.defaultFloor(), source: "daemon_default" };
      } catch (e) {
        const reason = e instanceof ProvidersError && e.reason !== undefined ? e.reason : "environment";
        throw new NotDispatchedError(
          reason,
          `no floor was set and this client could not learn the daemon's default floor, so it sent nothing (${e instanceof Error ? e.message : String(e)}); set minimum_isolation, or fix what the message says`,
          requestId,
          "client",
          { cause: e },
        );
      }
    }

    const path = "/v1/runs";
    const timeout = sent.limits?.timeout_ms ?? DEFAULT_RUN_BUDGET_MS;
    let status: number;
    let responseBody: Uint8Array;
    try {
      ({ status, body: responseBody } = await this.#http.send("POST", path, {
        body: requestBody,
        budgetMs: timeout + EXCHANGE_SLACK_MS,
        signal: options.signal,
      }));
    } catch (e) {
      if (!(e instanceof ExchangeFailure)) throw e;
      throw exchangeError(e, `${this.#url}${path}`, requestId);
    }

    if (status === 200) {
      const response = readAnswer(responseBody, readRunResponse, (e) =>
        badResponse(requestId, status, "not a run response", e),
      );
      return { request: sent, requestBody, response: verifyResponse(sent, response, floor), responseBody, floor };
    }
    throw refusal(requestId, status, responseBody);
  }

  /**
   * Opens a session (docs/sessions.md): one sandbox kept across calls, an interpreter of
   * `language` whose state survives from one cell to the next. The answer is checked: the
   * echoed request id, the tier against the floor (the one sent, or the daemon's default
   * floor) and against the floor the daemon says it applied, which must be that floor, and
   * the provider if one was named.
   */
  openSession(options: SessionOptions): Promise<Session> {
    return openSession(this.#http, this.#maxBodyBytes, options, () => this.defaultFloor());
  }

  /**
   * This caller's open session `id`, resumed where the daemon says its chain stands (its last
   * call's sequence and record digest): for a process that did not open it. With
   * `minimum_isolation`, its tier must meet that floor too.
   */
  session(id: string, options: { minimum_isolation?: Tier; signal?: AbortSignal } = {}): Promise<Session> {
    return resumeSession(this.#http, this.#maxBodyBytes, id, options);
  }

  /** This caller's open sessions, oldest first. */
  listSessions(options: { signal?: AbortSignal } = {}): Promise<SessionList> {
    return listSessions(this.#http, options);
  }

  /**
   * Opens a new session from this caller's snapshot (`session.snapshot()` took it; an id or
   * the `SnapshotInfo` itself): restored with the snapshot's interpreter state and fresh
   * randomness, its chain going on from the snapshot's. The answer is checked: the echoed
   * request id, a new open session whose origin says `restored` from that snapshot's digest
   * (`sha256`, or a given `SnapshotInfo`'s, which the daemon is also asked to hold it to) and,
   * given a `SnapshotInfo`, from its session at its place in that session's chain, and whose
   * chain starts there. A session that fails a check is closed again.
   */
  openSnapshot(snapshot: string | SnapshotInfo, options: SnapshotOpenOptions = {}): Promise<Session> {
    return openSnapshot(this.#http, this.#maxBodyBytes, snapshot, options);
  }

  /** This caller's snapshots, oldest first (a lookup: it runs nothing). */
  listSnapshots(options: { signal?: AbortSignal } = {}): Promise<SnapshotList> {
    return listSnapshots(this.#http, options);
  }

  /**
   * Deletes this caller's snapshot (an id or the `SnapshotInfo`): its files are removed.
   * Resolves to the snapshot as it was, once the answer is checked to be that one.
   */
  deleteSnapshot(snapshot: string | SnapshotInfo, options: { signal?: AbortSignal } = {}): Promise<SnapshotInfo> {
    return deleteSnapshot(this.#http, snapshot, options);
  }

  /**
   * The daemon's providers: tiers, availability and evidence, each `evidence_sha256` checked
   * against its evidence here.
   */
  async providers(): Promise<ProvidersResponse> {
    const url = `${this.#url}/v1/providers`;
    let status: number;
    let body: Uint8Array;
    try {
      ({ status, body } = await this.#http.send("GET", "/v1/providers", { budgetMs: LOOKUP_BUDGET_MS }));
    } catch (e) {
      if (!(e instanceof ExchangeFailure)) throw e;
      if (!e.maySent) {
        throw new ProvidersError(
          "unreachable",
          unreachable(url, e),
          { cause: e.cause },
        );
      }
      throw new ProvidersError("transport", `the exchange with ${url} failed: ${e.message}`, { cause: e.cause });
    }
    const bad = (what: string, cause: unknown): ProvidersError =>
      new ProvidersError("bad_response", `unreadable answer from ${url} (HTTP ${status}): ${what}: ${describeError(cause)}`, {
        status,
        cause,
      });
    if (status !== 200) {
      const answer = readAnswer(body, readErrorResponse, (e) => bad(`not an error response (${preview(body)})`, e));
      throw new ProvidersError(
        "refused",
        `the daemon at ${url} answered HTTP ${status} (${answer.error.code}): ${answer.error.message}`,
        { status, code: answer.error.code, reason: answer.error.not_dispatched ?? undefined },
      );
    }
    const providers = readAnswer(body, readProvidersResponse, (e) => bad("not a providers response", e));
    if (providers.protocol !== PROTOCOL) {
      throw new ProvidersError(
        "bad_response",
        `the daemon at ${url} speaks protocol ${providers.protocol}, this client protocol ${PROTOCOL}`,
        { status },
      );
    }
    for (const p of providers.providers) {
      const computed = evidenceSha256(p.evidence);
      if (computed !== p.evidence_sha256) {
        throw new ProvidersError(
          "evidence_digest_mismatch",
          `provider ${p.name}: its evidence digests to ${computed}, the answer says ${p.evidence_sha256}; the answer was altered on the way or the daemon is faulty`,
          { status },
        );
      }
    }
    return providers;
  }

  /**
   * The floor the daemon gives a request that sets none, from `GET /v1/providers`: asked once
   * per client (again only after a failure).
   */
  async defaultFloor(): Promise<Tier> {
    this.#defaultFloor ??= this.providers().then((p) => p.default_floor);
    try {
      return await this.#defaultFloor;
    } catch (e) {
      this.#defaultFloor = undefined;
      throw e;
    }
  }

  /** True when the daemon answers `GET /readyz` with 200; false when not ready or unreachable. */
  async isReady(): Promise<boolean> {
    try {
      const { status } = await this.#http.send("GET", "/readyz", { budgetMs: LOOKUP_BUDGET_MS, auth: false });
      return status === 200;
    } catch (e) {
      if (e instanceof ExchangeFailure) return false;
      throw e;
    }
  }

  /** Shows the URL, never the token. */
  [inspect.custom](): string {
    return `Client { url: ${JSON.stringify(this.#url)}, token: <redacted> }`;
  }

  /** The URL only: the token is not data. */
  toJSON(): { url: string } {
    return { url: this.#url };
  }

  /** The URL only. */
  toString(): string {
    return `Client(${this.#url})`;
  }
}

function positive(v: number | undefined, fallback: number, name: string): number {
  if (v === undefined) return fallback;
  if (!Number.isSafeInteger(v) || v <= 0) {
    throw new TypeError(`${name} must be a whole number greater than 0, not ${String(v)}`);
  }
  return v;
}

