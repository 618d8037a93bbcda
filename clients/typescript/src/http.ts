/**
 * One HTTP exchange with the daemon, on a connection of its own, and how an error answer
 * reads: a "not dispatched" mark believed only when the answer echoes the request id sent.
 * Internal: the client and its sessions share it; the token never leaves it but in the
 * `Authorization` header.
 * @module
 */

import { randomBytes } from "node:crypto";
import { inspect } from "node:util";

import { MayHaveRunError, NotDispatchedError } from "./errors.js";
import { JsonSyntaxError, type JsonValue, parseJson } from "./json.js";
import { ShapeError, readErrorResponse } from "./read.js";
import type { ErrorResponse } from "./types.js";

/** Added to a call's own timeout for the whole exchange (queueing, sandbox start, answer). */
export const EXCHANGE_SLACK_MS = 120_000;
/** The exchange budget of a run that sets no timeout: the daemon's built-in maximum timeout. */
export const DEFAULT_RUN_BUDGET_MS = 600_000;
/** The budget of an exchange that runs nothing (`/v1/providers`, `/readyz`, a session's lookup). */
export const LOOKUP_BUDGET_MS = 30_000;
/** What an error says when the request may have had its effect. */
export const MAY_HAVE_RUN = "the code may have run";
/** The header carrying the request id of a request without a JSON body (docs/sessions.md). */
export const REQUEST_ID_HEADER = "plimsoll-request-id";
/** The media type of a streamed answer. */
export const NDJSON = "application/x-ndjson";

/** A fresh request id: 128 random bits in lowercase hex. */
export function newRequestId(): string {
  return randomBytes(16).toString("hex");
}

/** How an exchange ended before a whole answer was read. */
export class ExchangeFailure extends Error {
  constructor(
    /** True when the request may have reached the daemon. */
    readonly maySent: boolean,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** What one exchange sends. */
export interface SendOptions {
  /** The body: JSON unless `contentType` says otherwise. */
  body?: Uint8Array;
  contentType?: string;
  /** Further request headers (`accept`, `plimsoll-request-id`). */
  headers?: Record<string, string>;
  /** The whole exchange's budget, answer included. */
  budgetMs: number;
  signal?: AbortSignal | undefined;
  /** Send the token (default true). */
  auth?: boolean;
  /**
   * Read a `200` answer of type {@link NDJSON} line by line as it comes, handing each line
   * (without its newline) here; reading stops when it returns `"done"`. A line handler that
   * throws ends the exchange with its error.
   */
  onLine?: (line: Uint8Array) => "more" | "done";
}

/** A whole answer; `streamed` when its lines went to `onLine` instead. */
export interface Answer {
  status: number;
  body: Uint8Array;
  streamed: boolean;
}

/** The daemon at one URL, with one caller's token. */
export class Http {
  readonly #url: string;
  readonly #token: string;
  readonly #maxAnswerBytes: number;

  constructor(url: string, token: string, maxAnswerBytes: number) {
    this.#url = url;
    this.#token = token;
    this.#maxAnswerBytes = maxAnswerBytes;
  }

  /** The daemon's base URL. */
  get url(): string {
    return this.#url;
  }

  /** One exchange with `path` under the base URL, the answer read within the budget. */
  async send(method: "GET" | "POST" | "PUT" | "DELETE", path: string, options: SendOptions): Promise<Answer> {
    const url = `${this.#url}${path}`;
    const headers: Record<string, string> = {
      ...options.headers,
      // A fresh connection per exchange: a connect failure then proves nothing was sent, and
      // no idle connection outlives a call (nothing keeps the caller's process alive).
      connection: "close",
      "user-agent": "plimsoll-client-typescript/0.1.0",
    };
    if (options.auth !== false) {
      headers.authorization = `Bearer ${this.#token}`;
    }
    if (options.body !== undefined) {
      headers["content-type"] = options.contentType ?? "application/json";
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
    const reason = (e: unknown): string => describeError(abort.signal.aborted ? abort.signal.reason : e);
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
        throw new ExchangeFailure(!nothingWasSent(e), reason(e), { cause: e });
      }
      const type = response.headers.get("content-type") ?? "";
      if (options.onLine !== undefined && response.status === 200 && type.split(";")[0]?.trim() === NDJSON) {
        await this.#readLines(response, abort, options.onLine, reason);
        return { status: response.status, body: new Uint8Array(0), streamed: true };
      }
      try {
        return { status: response.status, body: await readCapped(response, this.#maxAnswerBytes, abort), streamed: false };
      } catch (e) {
        throw new ExchangeFailure(true, `reading the answer: ${reason(e)}`, { cause: e });
      }
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", onAbort);
      // Whatever was left unread (a handler that stopped or threw) goes with its connection.
      abort.abort(new Error("the exchange is over"));
    }
  }

  /** Reads an NDJSON body as it comes, one line at a time, until `onLine` says done. */
  async #readLines(
    response: Response,
    abort: AbortController,
    onLine: (line: Uint8Array) => "more" | "done",
    reason: (e: unknown) => string,
  ): Promise<void> {
    if (response.body === null) {
      throw new ExchangeFailure(true, "the stream ended before its answer");
    }
    const reader = response.body.getReader();
    let pending: Uint8Array = new Uint8Array(0);
    let total = 0;
    for (;;) {
      let read: Awaited<ReturnType<typeof reader.read>>;
      try {
        read = await reader.read();
      } catch (e) {
        throw new ExchangeFailure(true, `reading the stream: ${reason(e)}`, { cause: e });
      }
      if (read.done) {
        throw new ExchangeFailure(true, "the stream ended before its answer");
      }
      total += read.value.byteLength;
      if (total > this.#maxAnswerBytes) {
        const e = new Error(`the answer is over this client's limit of ${this.#maxAnswerBytes} bytes (maxAnswerBytes)`);
        abort.abort(e);
        throw new ExchangeFailure(true, `reading the stream: ${e.message}`, { cause: e });
      }
      pending = pending.byteLength === 0 ? read.value : new Uint8Array(Buffer.concat([pending, read.value]));
      let start = 0;
      for (let nl = pending.indexOf(0x0a, start); nl !== -1; nl = pending.indexOf(0x0a, start)) {
        const line = pending.subarray(start, nl);
        start = nl + 1;
        if (line.byteLength === 0) continue;
        if (onLine(line) === "done") {
          void reader.cancel().catch(() => undefined);
          return;
        }
      }
      pending = pending.subarray(start);
    }
  }

  /** Shows the URL, never the token. */
  [inspect.custom](): string {
    return `Http { url: ${JSON.stringify(this.#url)}, token: <redacted> }`;
  }

  /** The URL only: the token is not data. */
  toJSON(): { url: string } {
    return { url: this.#url };
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

/** An error's message, with its cause's when that adds something. */
export function describeError(e: unknown): string {
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
export function readAnswer<T>(body: Uint8Array, read: (v: JsonValue) => T, bad: (cause: unknown) => Error): T {
  try {
    return read(parseJson(body));
  } catch (e) {
    if (e instanceof JsonSyntaxError || e instanceof ShapeError) throw bad(e);
    throw e;
  }
}

/** The message of an exchange that could not reach the daemon (nothing was sent). */
export function unreachable(url: string, e: ExchangeFailure): string {
  return `cannot reach the daemon at ${url} (${e.message}): check that plimsolld is running and the URL is right`;
}

/** The start of a body, for messages. */
export function preview(bytes: Uint8Array): string {
  return JSON.stringify(new TextDecoder().decode(bytes.subarray(0, 200)));
}

/** The error for an exchange that failed before a whole answer was read. */
export function exchangeError(e: ExchangeFailure, url: string, requestId: string, mayHave = MAY_HAVE_RUN): NotDispatchedError | MayHaveRunError {
  if (!e.maySent) {
    return new NotDispatchedError("environment", unreachable(url, e), requestId, "unreachable", { cause: e.cause });
  }
  return new MayHaveRunError(
    "transport",
    `${mayHave}: the exchange with ${url} failed after the request may have been sent (request ${requestId}): ${e.message}`,
    requestId,
    { cause: e.cause },
  );
}

/** An answer that could not be read as what it had to be: "may have run". */
export function badResponse(requestId: string, status: number, what: string, cause: unknown, mayHave = MAY_HAVE_RUN): MayHaveRunError {
  return new MayHaveRunError(
    "bad_response",
    `${mayHave}: unreadable answer from the daemon (request ${requestId}, HTTP ${status}): ${what}: ${describeError(cause)}`,
    requestId,
    { status, cause },
  );
}

/**
 * The error an error answer means for request `requestId`: "not dispatched" only when it
 * carries the mark and echoes that id; otherwise "may have run". The daemon's code and a
 * session's end reason ride along.
 */
export function refusal(requestId: string, status: number, body: Uint8Array, mayHave = MAY_HAVE_RUN): NotDispatchedError | MayHaveRunError {
  const answer = readAnswer(body, readErrorResponse, (e) =>
    badResponse(requestId, status, `not an error response (${preview(body)})`, e, mayHave),
  );
  return refusalOf(requestId, status, answer, mayHave);
}

/** {@link refusal}, for an error answer already read (a stream's last line). */
export function refusalOf(requestId: string, status: number, answer: ErrorResponse, mayHave = MAY_HAVE_RUN): NotDispatchedError | MayHaveRunError {
  const { code, message, not_dispatched: mark, end_reason: endReason } = answer.error;
  if (mark !== null && answer.request_id === requestId) {
    return new NotDispatchedError(mark, message, requestId, "daemon", { code, status, endReason });
  }
  if (mark !== null) {
    return new MayHaveRunError(
      "unverified_refusal",
      `${mayHave}: an answer claimed \`not dispatched (${mark})\` but echoed request id ${answer.request_id ?? "(none)"}, not ${requestId}; something between this client and the daemon mixed up answers`,
      requestId,
      // `.code` is the check that failed here, as in every client; what the answer claimed
      // (its code, reason and end reason) is kept apart, believed no more than the rest.
      { status, claimedCode: code, echoedRequestId: answer.request_id, claimedReason: mark, endReason },
    );
  }
  return new MayHaveRunError(
    "failed",
    `${mayHave} (request ${requestId}, HTTP ${status}, ${code}): ${message}; do not retry blindly`,
    requestId,
    { status, code, endReason },
  );
}
