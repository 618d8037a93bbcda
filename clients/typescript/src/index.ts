/**
 * `@plimsoll/client`: the official TypeScript client of plimsolld.
 *
 * ```ts
 * import { Client, notDispatchedReason, text } from "@plimsoll/client";
 *
 * const client = new Client({ url: "http://127.0.0.1:7878", token: process.env.PLIMSOLL_TOKEN! });
 * try {
 *   const res = await client.runJavaScript("console.log(6 * 7)", { minimum_isolation: "container" });
 *   console.log(text(res.result.stdout), res.isolation);
 * } catch (e) {
 *   const reason = notDispatchedReason(e);
 *   console.error(reason !== undefined ? `nothing ran (${reason})` : "the code may have run", e);
 * }
 * ```
 * @module
 */

export {
  Client,
  type ClientOptions,
  DEFAULT_MAX_ANSWER_BYTES,
  DEFAULT_MAX_BODY_BYTES,
  type Exchange,
  newRequestId,
  type RunOptions,
  type RunSettings,
  type TrialOptions,
} from "./client.js";
export {
  type DigestKind,
  DigestMismatchError,
  EvidenceMismatchError,
  type FloorSource,
  ImageMismatchError,
  MayHaveRunError,
  type MayHaveRunKind,
  NotDispatchedError,
  type NotDispatchedSource,
  notDispatchedReason,
  PlimsollError,
  ProviderMismatchError,
  ProvidersError,
  type ProvidersErrorKind,
  RecordMismatchError,
  RequestTooLargeError,
  SessionLookupError,
  type SessionLookupErrorKind,
  SessionMismatchError,
} from "./errors.js";
export { bytesToWire, decodeBase64, encodeBase64, text } from "./bytes.js";
export {
  canonicalJson,
  DOMAINS,
  encodeRecord,
  encodeRequest,
  encodeResult,
  evidenceSha256,
  recordSha256,
  requestSha256,
  resultSha256,
  sha256Hex,
} from "./digest.js";
export {
  decodeEvidence,
  decodeForkAnswer,
  decodeProvidersResponse,
  decodeRunRecord,
  decodeRunRequest,
  decodeRunResponse,
  decodeRunResult,
  decodeSessionInfo,
  decodeSnapshotInfo,
  decodeStreamLine,
  ShapeError,
} from "./read.js";
export {
  type CellOptions,
  type ChunkHandler,
  type Fork,
  Session,
  type SessionFile,
  type SessionOptions,
  type SnapshotOpenOptions,
  type StepsOptions,
} from "./session.js";
export { JsonSyntaxError } from "./json.js";
export { TRIAL_RUNNER, type TrialSpec, trialProject } from "./trial.js";
export { checkImage, type Floor, verifyResponse } from "./verify.js";
export * from "./types.js";
