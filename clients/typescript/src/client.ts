/**
 * The client of one plimsolld: sends each run with a fresh request id, honours a "not
 * dispatched" mark only when the answer echoes that id, recomputes the request, result and
 * record digests, and re-checks the tier against the floor (the one sent, or the daemon's
 * default floor) and the provider against the one named.
 * @module
 */

import { randomBytes } from "node:crypto";
import { inspect } from "node:util";

import { bytesToWire, utf8 } from "./bytes.js";
import { evidenceSha256 } from "./digest.js";
import {
  MayHaveRunError,
  NotDispatchedError,
  ProvidersError,
  RequestTooLargeError,
} from "./errors.js";
import { JsonSyntaxError, type JsonValue, parseJson } from "./json.js";
import { ShapeError, readErrorResponse, readProvidersResponse, readRunRequest, readRunResponse } from "./read.js";
import {
  type Language,
  LIMIT_NAMES,
  type Limits,
  PROTOCOL,
  type Project,
  type ProvidersResponse,
  type RunRequest,
  type RunResponse,
  type RunSpec,
  TIERS,
  type Tier,
} from "./types.js";
import { type Floor, verifyResponse } from "./verify.js";

/** The largest request body sent unless told otherwise: the daemon's default `max_body_bytes`. */
export const DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024;
/** The largest answer read unless told otherwise (outputs and artifacts can be large). */
export const DEFAULT_MAX_ANSWER_BYTES = 1024 * 1024 * 1024;
/** The exchange budget of a run that sets no timeout: the daemon's built-in maximum timeout. */
const DEFAULT_RUN_BUDGET_MS = 600_000;
/** Added to the run's own timeout for the whole exchange (queueing, sandbox start, answer). */
const EXCHANGE_SLACK_MS = 120_000;
/** The budget of an exchange that runs nothing (`/v1/providers`, `/readyz`). */
const LOOKUP_BUDGET_MS = 30_000;

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
  /** Aborts the exchange: a {@link MayHaveRunError} (`transport`), as the request may have left. */
  signal?: AbortSignal;
}

/** Options of a run whose `run` is given separately. */
export type RunSettings = Omit<RunOptions, "run">;

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

/** A fresh request id: 128 random bits in lowercase hex. */
export function newRequestId(): string {
  return randomBytes(16).toString("hex");
}

/** How an exchange ended before a whole answer was read. */
class ExchangeFailure extends Error {
  constructor(
    /** True when the request may have reached the daemon. */
    readonly maySent: boolean,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** A client of one daemon. Holds no connection between calls: each exchange opens its own. */
export class Client {
  readonly #url: string;
  readonly #token: string;
  readonly #maxBodyBytes: number;
  readonly #maxAnswerBytes: number;
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
    this.#token = options.token;
    this.#maxBodyBytes = positive(options.maxBodyBytes, DEFAULT_MAX_BODY_BYTES, "maxBodyBytes");
    this.#maxAnswerBytes = positive(options.maxAnswerBytes, DEFAULT_MAX_ANSWER_BYTES, "maxAnswerBytes");
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

    const url = `${this.#url}/v1/runs`;
    const timeout = sent.limits?.timeout_ms ?? DEFAULT_RUN_BUDGET_MS;
    let status: number;
    let responseBody: Uint8Array;
    try {
      ({ status, body: responseBody } = await this.#send("POST", url, {
        body: requestBody,
        budgetMs: timeout + EXCHANGE_SLACK_MS,
        signal: options.signal,
      }));
    } catch (e) {
      if (!(e instanceof ExchangeFailure)) throw e;
      if (!e.maySent) {
        throw new NotDispatchedError(
          "environment",
          unreachable(url, e),
          requestId,
          "unreachable",
          { cause: e.cause },
        );
      }
      throw new MayHaveRunError(
        "transport",
        `the code may have run: the exchange with ${url} failed after the request may have been sent (request ${requestId}): ${e.message}`,
        requestId,
        { cause: e.cause },
      );
    }

    const badResponse = (what: string, cause: unknown): MayHaveRunError =>
      new MayHaveRunError(
        "bad_response",
        `the code may have run: unreadable answer from the daemon (request ${requestId}, HTTP ${status}): ${what}: ${describeError(cause)}`,
        requestId,
        { status, cause },
      );

    if (status === 200) {
      const response = readAnswer(responseBody, readRunResponse, (e) => badResponse("not a run response", e));
      return { request: sent, requestBody, response: verifyResponse(sent, response, floor), responseBody, floor };
    }

    const answer = readAnswer(responseBody, readErrorResponse, (e) =>
      badResponse(`not an error response (${preview(responseBody)})`, e),
    );
    const { code, message, not_dispatched: mark } = answer.error;
    if (mark !== null && answer.request_id === requestId) {
      throw new NotDispatchedError(mark, message, requestId, "daemon", { code, status });
    }
    if (mark !== null) {
      throw new MayHaveRunError(
        "unverified_refusal",
        `the code may have run: an answer claimed \`not dispatched (${mark})\` but echoed request id ${answer.request_id ?? "(none)"}, not ${requestId}; something between this client and the daemon mixed up answers`,
        requestId,
        { status, code, echoedRequestId: answer.request_id, claimedReason: mark },
      );
    }
    throw new MayHaveRunError(
      "failed",
      `the code may have run (request ${requestId}, HTTP ${status}, ${code}): ${message}; do not retry blindly`,
      requestId,
      { status, code },
    );
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
      ({ status, body } = await this.#send("GET", url, { budgetMs: LOOKUP_BUDGET_MS }));
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
      const { status } = await this.#send("GET", `${this.#url}/readyz`, { budgetMs: LOOKUP_BUDGET_MS, auth: false });
      return status === 200;
    } catch (e) {
      if (e instanceof ExchangeFailure) return false;
      throw e;
    }
  }

  /** One HTTP exchange on a connection of its own, the whole answer read within a budget. */
  async #send(
    method: "GET" | "POST",
    url: string,
    options: { body?: Uint8Array; budgetMs: number; signal?: AbortSignal | undefined; auth?: boolean },
  ): Promise<{ status: number; body: Uint8Array }> {
    const headers: Record<string, string> = {
      // A fresh connection per exchange: a connect failure then proves nothing was sent, and
      // no idle connection outlives a call (nothing keeps the caller's process alive).
      connection: "close",
      "user-agent": "plimsoll-client-typescript/0.1.0",
    };
    if (options.auth !== false) {
      headers.authorization = `Bearer ${this.#token}`;
    }
    if (options.body !== undefined) {
      headers["content-type"] = "application/json";
    }
    const abort = new AbortController();
    const timer = setTimeout(
      () => abort.abort(new Error(`no whole answer within ${options.budgetMs} ms`)),
      options.budgetMs,
    );
    timer.unref();
    const outer = options.signal;
    const onAbort = (): void => abort.abort(outer?.reason ?? new Error("aborted by the caller"));
    if (outer !== undefined) {
      if (outer.aborted) onAbort();
      else outer.addEventListener("abort", onAbort, { once: true });
    }
    try {
      let response: Response;
      try {
        response = await fetch(url, {
          method,
          headers,
          body: options.body,
          // Redirects are answers too: a run is never replayed elsewhere.
          redirect: "manual",
          signal: abort.signal,
        });
      } catch (e) {
        throw new ExchangeFailure(!nothingWasSent(e), describeError(abort.signal.aborted ? abort.signal.reason : e), {
          cause: e,
        });
      }
      try {
        return { status: response.status, body: await readCapped(response, this.#maxAnswerBytes, abort) };
      } catch (e) {
        throw new ExchangeFailure(
          true,
          `reading the answer: ${describeError(abort.signal.aborted ? abort.signal.reason : e)}`,
          { cause: e },
        );
      }
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", onAbort);
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

/** Reads a whole body, refusing one over `max` bytes. */
async function readCapped(response: Response, max: number, abort: AbortController): Promise<Uint8Array> {
  if (response.body === null) {
    return new Uint8Array(0);
  }
  const chunks: Uint8Array[] = [];
  let total = 0;
  for await (const chunk of response.body) {
    total += chunk.byteLength;
    if (total > max) {
      const e = new Error(`the answer is over this client's limit of ${max} bytes (maxAnswerBytes)`);
      abort.abort(e);
      throw e;
    }
    chunks.push(chunk);
  }
  return new Uint8Array(Buffer.concat(chunks));
}

/**
 * True only for failures that happen before a connection exists: a name that does not
 * resolve, a refused or timed-out connect, a port fetch refuses to use. Each exchange opens
 * its own connection and writes nothing before it is up, so none of the request left.
 */
function nothingWasSent(e: unknown): boolean {
  // Aborts and timeouts are DOMExceptions: they may come after the request left.
  return e instanceof TypeError && beforeConnect((e as { cause?: unknown }).cause);
}

function beforeConnect(cause: unknown): boolean {
  if (cause instanceof AggregateError) {
    // Several addresses tried in turn (happy eyeballs): each must have failed to connect.
    return cause.errors.length > 0 && cause.errors.every(beforeConnect);
  }
  if (typeof cause !== "object" || cause === null) {
    return false;
  }
  const { code, syscall, message } = cause as { code?: unknown; syscall?: unknown; message?: unknown };
  // A TCP refusal or an unroutable address is reported by connect() itself; a reset or an
  // unreachable network on an open connection comes from read or write, and stays "may
  // have run".
  return (
    syscall === "connect" ||
    syscall === "getaddrinfo" ||
    code === "UND_ERR_CONNECT_TIMEOUT" ||
    message === "bad port"
  );
}

function describeError(e: unknown): string {
  if (e instanceof Error) {
    const cause = (e as { cause?: unknown }).cause;
    return cause instanceof Error && !e.message.includes(cause.message) ? `${e.message} (${cause.message})` : e.message;
  }
  return String(e);
}

/**
 * Reads an answer's JSON with `read`; one that is not JSON or not of that shape is
 * `bad(cause)`.
 */
function readAnswer<T>(body: Uint8Array, read: (v: JsonValue) => T, bad: (cause: unknown) => Error): T {
  try {
    return read(parseJson(body));
  } catch (e) {
    if (e instanceof JsonSyntaxError || e instanceof ShapeError) throw bad(e);
    throw e;
  }
}

/** The message of an exchange that could not reach the daemon (nothing was sent). */
function unreachable(url: string, e: ExchangeFailure): string {
  return `cannot reach the daemon at ${url} (${e.message}): check that plimsolld is running and the URL is right`;
}

/** The start of a body, for messages. */
function preview(bytes: Uint8Array): string {
  return JSON.stringify(new TextDecoder().decode(bytes.subarray(0, 200)));
}

function positive(v: number | undefined, fallback: number, name: string): number {
  if (v === undefined) return fallback;
  if (!Number.isSafeInteger(v) || v <= 0) {
    throw new TypeError(`${name} must be a whole number greater than 0, not ${String(v)}`);
  }
  return v;
}

// ---------------------------------------------------------------------------------------
// Building the request: the checks a server makes that need no settings, so that a malformed
// request is refused here ("not dispatched", nothing sent) with a message saying what to fix.

class RequestShapeError extends Error {}

function fail(message: string): never {
  throw new RequestShapeError(message);
}

/** Blank as the daemon reads it: nothing but Unicode White_Space. */
function blank(s: string): boolean {
  return /^\p{White_Space}*$/u.test(s);
}

function text(v: unknown, what: string): string {
  if (typeof v !== "string") fail(`${what} must be a string`);
  if (!v.isWellFormed()) fail(`${what} holds a lone surrogate: it is not valid Unicode and has no UTF-8`);
  return v;
}

function only(v: unknown, what: string, allowed: readonly string[]): Record<string, unknown> {
  if (typeof v !== "object" || v === null || Array.isArray(v)) fail(`${what} must be an object`);
  for (const k of Object.keys(v)) {
    if (!allowed.includes(k)) fail(`${what} has an unknown member \`${k}\` (allowed: ${allowed.join(", ")})`);
  }
  return v as Record<string, unknown>;
}

function projectPath(v: unknown, what: string): string {
  const p = text(v, what);
  const bad =
    p === "" ||
    utf8(p).byteLength > 4096 ||
    p.startsWith("/") ||
    p.includes("\0") ||
    p.includes("\\") ||
    p.split("/").some((s) => s === "" || s === "." || s === "..");
  if (bad) {
    fail(`${what} \`${p}\` must be relative to /work, with no empty, \`.\` or \`..\` segment, no backslash or NUL, at most 4096 bytes`);
  }
  return p;
}

function buildRun(v: unknown): Record<string, unknown> {
  const kind = only(v, "run", ["kind", "language", "code", "files", "steps", "artifacts"]).kind;
  if (kind === "snippet") {
    const s = only(v, "run", ["kind", "language", "code"]);
    if (s.language !== "javascript" && s.language !== "python") {
      fail(`run.language must be \`javascript\` or \`python\`, not ${JSON.stringify(s.language)}`);
    }
    const code = text(s.code, "run.code");
    if (blank(code)) fail("run.code is empty: send the code to run");
    return { kind, language: s.language, code };
  }
  if (kind !== "project") fail(`run.kind must be \`snippet\` or \`project\`, not ${JSON.stringify(kind)}`);
  const p = only(v, "run", ["kind", "files", "steps", "artifacts"]);
  const out: Record<string, unknown> = { kind };
  if (p.files !== undefined) {
    if (!Array.isArray(p.files)) fail("run.files must be a list");
    const seen = new Set<string>();
    out.files = p.files.map((f: unknown, i) => {
      const what = `run.files[${i}]`;
      const m = only(f, what, ["path", "content", "executable"]);
      const path = projectPath(m.path, `${what}.path`);
      if (seen.has(path)) fail(`run.files: \`${path}\` appears twice`);
      seen.add(path);
      let content: unknown;
      if (typeof m.content === "string") content = text(m.content, `${what}.content`);
      else if (m.content instanceof Uint8Array) content = bytesToWire(m.content);
      else fail(`${what}.content must be a string or a Uint8Array`);
      if (m.executable !== undefined && typeof m.executable !== "boolean") fail(`${what}.executable must be a boolean`);
      return { path, content, executable: m.executable === true };
    });
  }
  if (!Array.isArray(p.steps) || p.steps.length === 0) fail("run.steps is empty: a project needs at least one step");
  out.steps = p.steps.map((s: unknown, i) => {
    const what = `run.steps[${i}]`;
    const m = only(s, what, ["name", "run"]);
    const run = text(m.run, `${what}.run`);
    if (blank(run)) fail(`${what}.run is empty`);
    return m.name === undefined ? { run } : { name: text(m.name, `${what}.name`), run };
  });
  if (p.artifacts !== undefined) {
    if (!Array.isArray(p.artifacts)) fail("run.artifacts must be a list");
    out.artifacts = p.artifacts.map((a: unknown, i) => projectPath(a, `run.artifacts[${i}]`));
  }
  return out;
}

/** The request's JSON object, members in the order sent (`request_id` early, so that even a
 * refusal of a cut-off body can echo it). */
function buildRequest(options: RunOptions, requestId: string): Record<string, unknown> {
  const o = only(options, "the run options", ["run", "minimum_isolation", "provider", "limits", "grant", "signal"]);
  const wire: Record<string, unknown> = { protocol: PROTOCOL, request_id: requestId };
  if (o.minimum_isolation !== undefined) {
    if (!(TIERS as readonly unknown[]).includes(o.minimum_isolation)) {
      fail(`minimum_isolation must be one of ${TIERS.join(", ")}, not ${JSON.stringify(o.minimum_isolation)}`);
    }
    wire.minimum_isolation = o.minimum_isolation;
  }
  if (o.provider !== undefined) {
    if (text(o.provider, "provider") === "") fail("provider must not be empty: omit it to let the daemon choose");
    wire.provider = o.provider;
  }
  if (o.limits !== undefined) {
    const l = only(o.limits, "limits", LIMIT_NAMES);
    const out: Record<string, number> = {};
    for (const k of LIMIT_NAMES) {
      const n = l[k];
      if (n === undefined) continue;
      if (typeof n !== "number" || !Number.isSafeInteger(n) || n <= 0) {
        fail(`limits.${k} must be a whole number greater than 0, not ${String(n)}`);
      }
      out[k] = n;
    }
    wire.limits = out;
  }
  wire.run = buildRun(o.run);
  if (o.grant !== undefined) {
    if (text(o.grant, "grant") === "") fail("grant must not be empty: omit it for a run without grants");
    wire.grant = o.grant;
  }
  return wire;
}
