/**
 * The client's errors. Each says whether the code could have run: only a
 * {@link NotDispatchedError} promises that nothing ran; every {@link MayHaveRunError} (and its
 * subclasses, the failed checks on a result) means it may have, so never retry one blindly.
 * @module
 */

import type { EndReason, ImageRef, Reason, Tier } from "./types.js";

/** Every error this client throws. */
export abstract class PlimsollError extends Error {
  /** A stable machine-readable code: a reason's name, the daemon's code, or the check that failed. */
  abstract readonly code: string;
  /** The request id this client sent (or would have sent), when there was a run request. */
  readonly requestId: string | undefined;

  protected constructor(message: string, requestId: string | undefined, options?: ErrorOptions) {
    super(message, options);
    this.requestId = requestId;
    this.name = new.target.name;
  }
}

/** What a {@link NotDispatchedError} came from. */
export type NotDispatchedSource =
  /** The daemon refused, echoing this request's id. */
  | "daemon"
  /** This client refused the request before sending it. */
  | "client"
  /** The daemon could not be reached: the connection never opened. */
  | "unreachable";

/**
 * Nothing ran: the daemon refused the request (echoing this request's id), or this client
 * never sent it. `reason` says why; retrying may help for `capacity`.
 */
export class NotDispatchedError extends PlimsollError {
  readonly code: string;

  constructor(
    /** Why nothing ran. */
    readonly reason: Reason,
    message: string,
    requestId: string | undefined,
    readonly source: NotDispatchedSource,
    details: { code?: string; status?: number; endReason?: EndReason | undefined; cause?: unknown } = {},
  ) {
    super(`not dispatched (${reason}): ${message}`, requestId, { cause: details.cause });
    this.code = details.code ?? reason;
    this.status = details.status;
    this.endReason = details.endReason;
  }

  /** The HTTP status of the daemon's refusal, when it came from the daemon. */
  readonly status: number | undefined;
  /**
   * For a call to a session that has ended (`code` `session_ended`, `sandbox_changed`, or
   * `session_not_found` after a daemon restart): why it ended.
   */
  readonly endReason: EndReason | undefined;
}

/** The request body is larger than this client sends (the daemon's limit): it was not sent. */
export class RequestTooLargeError extends NotDispatchedError {
  constructor(
    /** The body's size in bytes. */
    readonly size: number,
    /** This client's limit in bytes. */
    readonly limit: number,
    requestId: string,
  ) {
    super(
      "request",
      `the request is ${size} bytes, over this client's limit of ${limit} bytes (the daemon's max_body_bytes): send less, or raise maxBodyBytes to match the daemon's`,
      requestId,
      "client",
    );
  }
}

/** Why a {@link MayHaveRunError} was thrown. */
export type MayHaveRunKind =
  /** The daemon answered an error without the not-dispatched mark. */
  | "failed"
  /** An answer claimed "not dispatched" but echoed another request's id, or none. */
  | "unverified_refusal"
  /** A result echoed another request's id: it is not this request's result. */
  | "request_id_mismatch"
  /** The exchange failed after the request may have been sent (reset, timeout, abort). */
  | "transport"
  /** The answer could not be read as a result or an error. */
  | "bad_response"
  /** A digest recomputed here differs from the answer's ({@link DigestMismatchError}). */
  | "digest_mismatch"
  /** The record disagrees with the response around it ({@link RecordMismatchError}). */
  | "record_mismatch"
  /** The run used a tier below the floor ({@link EvidenceMismatchError}). */
  | "evidence_mismatch"
  /** The run used another provider than the one named ({@link ProviderMismatchError}). */
  | "provider_mismatch"
  /** The run (or a session) named an image, and the record names another or none ({@link ImageMismatchError}). */
  | "image_mismatch"
  /**
   * A session's answer disagrees with the session: its chain, provider, tier, evidence or
   * floor ({@link SessionMismatchError}).
   */
  | "session_mismatch";

/** The code may have run: there is no verified result, and a retry may run it twice. */
export class MayHaveRunError extends PlimsollError {
  readonly code: string;
  /** The HTTP status of the answer, if one was read. */
  readonly status: number | undefined;
  /** For `unverified_refusal` and `request_id_mismatch`: the id the answer echoed. */
  readonly echoedRequestId: string | null | undefined;
  /** For `unverified_refusal`: the reason the answer claimed (not honoured). */
  readonly claimedReason: Reason | undefined;
  /**
   * For `unverified_refusal`: the error code the answer claimed (`isolation`,
   * `session_ended`, ...), not honoured; `.code` is then `unverified_refusal`.
   */
  readonly claimedCode: string | undefined;
  /** For a session call the daemon answered with an end reason (`sandbox_failed`, ...): why it ended. */
  readonly endReason: EndReason | undefined;
  /**
   * For a session whose opening answer failed a check: the client closes it again, and this
   * is why that failed too (`undefined` when it was closed, or nothing was to be closed).
   */
  closeError: unknown = undefined;

  constructor(
    readonly kind: MayHaveRunKind,
    message: string,
    requestId: string | undefined,
    details: {
      code?: string;
      status?: number;
      echoedRequestId?: string | null;
      claimedReason?: Reason;
      claimedCode?: string;
      endReason?: EndReason | undefined;
      cause?: unknown;
    } = {},
  ) {
    super(message, requestId, { cause: details.cause });
    this.code = details.code ?? kind;
    this.claimedCode = details.claimedCode;
    this.status = details.status;
    this.echoedRequestId = details.echoedRequestId;
    this.claimedReason = details.claimedReason;
    this.endReason = details.endReason;
  }
}

/** Which digest a {@link DigestMismatchError} concerns. */
export type DigestKind = "request" | "result" | "record";

/** A digest recomputed here differs from the one in the answer: never use that result. */
export class DigestMismatchError extends MayHaveRunError {
  constructor(
    /** Which digest. */
    readonly digest: DigestKind,
    /** What this client computed. */
    readonly computed: string,
    /** What the answer stated. */
    readonly claimed: string,
    requestId: string,
  ) {
    super(
      "digest_mismatch",
      `${digest} digest mismatch for request ${requestId}: computed ${computed}, the answer says ${claimed}; the answer was altered on the way or the daemon is faulty, and the code may have run`,
      requestId,
    );
  }
}

/** The run record disagrees with the response around it. */
export class RecordMismatchError extends MayHaveRunError {
  constructor(
    /** The member that differs. */
    readonly field: string,
    /**
     * Its value in the response (or as computed here). For `minimum_isolation`: the floor
     * sent, or the daemon's default floor when none was sent.
     */
    readonly response: string,
    /** Its value in the record. */
    readonly record: string,
    requestId: string,
    /** What the record was held against, for the message. */
    against = "the response",
  ) {
    super(
      "record_mismatch",
      `the run record disagrees with ${against} on \`${field}\` for request ${requestId}: ${against} ${response}, record ${record}; the answer was altered or the daemon is faulty, and the code may have run`,
      requestId,
    );
  }
}

/** Where the floor an {@link EvidenceMismatchError} was checked against came from. */
export type FloorSource =
  /** The request's `minimum_isolation`. */
  | "request"
  /** None was sent: the daemon's `default_floor` from `GET /v1/providers`. */
  | "daemon_default"
  /** The floor the record says the daemon applied (`record.minimum_isolation`). */
  | "record"
  /** A session's call: the floor the session was opened with (`SessionInfo.minimum_isolation`). */
  | "session";

/**
 * The result says the run used a tier below the floor. The code ran (this is not a refusal),
 * but not behind the wall required.
 */
export class EvidenceMismatchError extends MayHaveRunError {
  constructor(
    /** The provider the answer names. */
    readonly provider: string,
    /** The tier the answer states (the weaker of response and record). */
    readonly isolation: Tier,
    /** The floor. */
    readonly floor: Tier,
    /** Whether the floor was sent or was the daemon's default. */
    readonly floorSource: FloorSource,
    requestId: string,
  ) {
    const which =
      floorSource === "request"
        ? "asked for"
        : floorSource === "record"
          ? "the floor the record says the daemon applied"
          : floorSource === "session"
            ? "the floor the session was opened with"
            : "the daemon's default floor, none having been sent";
    super(
      "evidence_mismatch",
      `evidence mismatch for request ${requestId}: the run used \`${isolation}\` (provider ${provider}), below the floor \`${floor}\` (${which}); the code ran, but not behind the wall you required`,
      requestId,
      { code: "evidence_mismatch" },
    );
  }
}

/** The result says the run used another provider than the one named. The code ran. */
export class ProviderMismatchError extends MayHaveRunError {
  constructor(
    /** The provider the request named. */
    readonly asked: string,
    /** The provider the answer (response or record) names. */
    readonly provider: string,
    requestId: string,
  ) {
    super(
      "provider_mismatch",
      `evidence mismatch for request ${requestId}: the run used provider \`${provider}\`, not \`${asked}\` as asked; the code ran, but not where you required`,
      requestId,
      { code: "evidence_mismatch" },
    );
  }
}

/**
 * The request (or the session's open) named an image, and the answer's record (or the
 * session) names another one, or none: a request is never served by another image than the
 * one it named (docs/protocol.md). The code ran (this is not a refusal), but not in the image
 * named. Its `code` is `evidence_mismatch`, as for a tier below the floor.
 */
export class ImageMismatchError extends MayHaveRunError {
  constructor(
    /** The image the request or the open named (a name or an identity). */
    readonly asked: string,
    /** The image the record (or the session) names; `undefined`: none. */
    readonly image: ImageRef | undefined,
    requestId: string,
    /** What ran: `the run`, `the session`, `the session call`. */
    subject = "the run",
  ) {
    const ran = image === undefined ? "names no image (no `image` member)" : `ran in image \`${image.name}\` (${image.identity})`;
    super(
      "image_mismatch",
      `evidence mismatch for request ${requestId}: ${subject} ${ran}, not the image \`${asked}\` asked for; the code ran, but not in the image you named`,
      requestId,
      { code: "evidence_mismatch", status: 200 },
    );
  }
}

/**
 * A session's answer disagrees with the session (docs/sessions.md, "Chained records"): a
 * call's record names another session, or is not the next link of its chain (a call missing,
 * repeated or reordered: `sequence`, `previous_record_sha256`), or names another provider,
 * tier, evidence or environment than the session's, or another origin (`origin`,
 * `origin.<member>`: a restored or forked session's every record says where it came from, as
 * the session does); or the answer to opening, resuming or closing a session is not the
 * session asked for; or a snapshot is not of this session where its chain stands (`calls`,
 * `last_record_sha256`), or a copy opened from one does not say it came from there or does
 * not start its chain there (`field` says which member).
 */
export class SessionMismatchError extends MayHaveRunError {
  constructor(
    /** The member that disagrees (`sequence`, `previous_record_sha256`, `session_id`, `provider`, ...). */
    readonly field: string,
    /** What the session says it must be (`undefined`: absent). */
    readonly expected: string | undefined,
    /** What the answer says (`undefined`: absent). */
    readonly found: string | undefined,
    requestId: string,
    /** Why it matters, for the message. */
    why: string,
  ) {
    super(
      "session_mismatch",
      `session mismatch for request ${requestId}: \`${field}\` is ${found ?? "absent"}, the session's is ${expected ?? "absent"}: ${why}; the call may have run`,
      requestId,
    );
  }
}

/**
 * What went wrong looking a session up (`listSessions()`, `session(id)`, `refresh()`), or
 * listing snapshots (`listSnapshots()`).
 */
export type SessionLookupErrorKind = "request" | "unreachable" | "refused" | "transport" | "bad_response";

/**
 * A session lookup (or a snapshot listing) gave no verified answer. A lookup runs nothing, so
 * nothing ran; `code` is the daemon's (`session_not_found`, `session_ended`) and `endReason`
 * says why a session ended, when the daemon said.
 */
export class SessionLookupError extends PlimsollError {
  readonly code: string;

  constructor(
    readonly kind: SessionLookupErrorKind,
    message: string,
    details: { code?: string; status?: number; reason?: Reason; endReason?: EndReason | undefined; cause?: unknown } = {},
  ) {
    super(message, undefined, { cause: details.cause });
    this.code = details.code ?? kind;
    this.status = details.status;
    this.reason = details.reason;
    this.endReason = details.endReason;
  }

  /** The HTTP status, if an answer was read. */
  readonly status: number | undefined;
  /** The daemon's not-dispatched reason, if its error answer carried one. */
  readonly reason: Reason | undefined;
  /** Why the session ended, if the daemon said. */
  readonly endReason: EndReason | undefined;
}

/** What went wrong with `GET /v1/providers`. */
export type ProvidersErrorKind =
  | "unreachable"
  | "refused"
  | "transport"
  | "bad_response"
  /** A provider's `evidence_sha256` is not the digest of its evidence. */
  | "evidence_digest_mismatch";

/** `providers()` gave no verified answer. Nothing runs on this call, so nothing ran. */
export class ProvidersError extends PlimsollError {
  readonly code: string;

  constructor(
    readonly kind: ProvidersErrorKind,
    message: string,
    details: { code?: string; status?: number; reason?: Reason; cause?: unknown } = {},
  ) {
    super(message, undefined, { cause: details.cause });
    this.code = details.code ?? kind;
    this.status = details.status;
    this.reason = details.reason;
  }

  /** The HTTP status, if an answer was read. */
  readonly status: number | undefined;
  /** The daemon's not-dispatched reason, if its error answer carried one. */
  readonly reason: Reason | undefined;
}

/**
 * Did nothing run? The reason when `err` promises that nothing ran (a
 * {@link NotDispatchedError}), otherwise `undefined`: the code may have run.
 */
export function notDispatchedReason(err: unknown): Reason | undefined {
  return err instanceof NotDispatchedError ? err.reason : undefined;
}
