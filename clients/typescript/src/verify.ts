/**
 * The checks on every `200` answer: the echoed request id and protocol, the tier against the
 * floor, the record's applied floor (present, met by the tier, equal to the floor), the
 * provider and the image against the ones named, the three digests recomputed here, and the
 * record against the response around it.
 *
 * Without a signature this catches an answer meant for another request, a tier below the
 * floor, and any change to the request, result or record that leaves a stated digest stale.
 * A party in the middle that rewrites a field *and* recomputes every digest over it is caught
 * only when the field is the tier and it falls below the floor (or the provider named): that
 * is what signed records are for.
 * @module
 */

import { recordSha256, requestSha256, resultSha256 } from "./digest.js";
import {
  DigestMismatchError,
  EvidenceMismatchError,
  type FloorSource,
  ImageMismatchError,
  MayHaveRunError,
  ProviderMismatchError,
  RecordMismatchError,
} from "./errors.js";
import { type ImageRef, PROTOCOL, type RunRequest, type RunResponse, type Tier, imageAnswers, tierRank } from "./types.js";

/** The floor a result is checked against, and where it came from. */
export interface Floor {
  tier: Tier;
  source: FloorSource;
}

/**
 * Checks that `image` (what a record or a session names; `undefined`: nothing) is the image
 * `asked` names, by its name or its identity: a request is never served by another image
 * than the one it named. Throws an {@link ImageMismatchError} otherwise.
 */
export function checkImage(asked: string, image: ImageRef | undefined, requestId: string, subject = "the run"): void {
  if (image === undefined || !imageAnswers(image, asked)) {
    throw new ImageMismatchError(asked, image, requestId, subject);
  }
}

/**
 * Verifies a `200` answer to `sent` (the request exactly as sent, read back from its bytes).
 * `floor` is the request's `minimum_isolation`, or the daemon's default floor when it sent
 * none. When the request named an image (`sent.image`), the record must name it. Returns the
 * response when every check passes; throws a {@link MayHaveRunError} (or one of its
 * subclasses) otherwise.
 */
export function verifyResponse(sent: RunRequest, response: RunResponse, floor: Floor | undefined): RunResponse {
  const id = sent.request_id;
  for (const echoed of [response.request_id, response.record.request_id]) {
    if (echoed !== id) {
      throw new MayHaveRunError(
        "request_id_mismatch",
        `the code may have run: the result echoes request id ${echoed}, not ${id}; something between this client and the daemon mixed up answers, so this result is not yours`,
        id,
        { echoedRequestId: echoed, status: 200 },
      );
    }
  }
  if (response.protocol !== PROTOCOL) {
    throw new MayHaveRunError(
      "bad_response",
      `the code may have run: the result speaks protocol ${response.protocol}, this client protocol ${PROTOCOL} (request ${id})`,
      id,
      { status: 200 },
    );
  }
  // The tier comes before the digests: whatever else is wrong, a run below the floor is the
  // fact the caller most needs, and it is an error even if every digest matched.
  const weakest =
    tierRank(response.record.isolation) < tierRank(response.isolation) ? response.record.isolation : response.isolation;
  if (floor !== undefined && tierRank(weakest) < tierRank(floor.tier)) {
    throw new EvidenceMismatchError(response.provider, weakest, floor.tier, floor.source, id);
  }
  // The record states the floor the daemon applied: the one sent, or its default floor when
  // none was sent. It must be there, the tier must meet it, and it must be the floor this
  // client held the run to (which also catches a daemon whose listing and records disagree).
  const applied = response.record.minimum_isolation;
  if (applied === undefined) {
    throw new MayHaveRunError(
      "bad_response",
      `the code may have run: the record states no applied floor (\`record.minimum_isolation\`) for request ${id}: the daemon is older than this client or faulty; upgrade plimsolld`,
      id,
      { status: 200 },
    );
  }
  if (tierRank(weakest) < tierRank(applied)) {
    throw new EvidenceMismatchError(response.provider, weakest, applied, "record", id);
  }
  if (floor !== undefined && applied !== floor.tier) {
    throw new RecordMismatchError(
      "minimum_isolation",
      floor.tier,
      applied,
      id,
      floor.source === "request"
        ? "the floor sent"
        : floor.source === "session"
          ? "the session's floor"
          : "the daemon's default floor",
    );
  }
  if (sent.provider !== undefined) {
    for (const named of [response.provider, response.record.provider]) {
      if (named !== sent.provider) {
        throw new ProviderMismatchError(sent.provider, named, id);
      }
    }
  }
  // The image named, like the tier: the record must say the code ran in it.
  if (sent.image !== undefined) checkImage(sent.image, response.record.image, id);

  // What the types cannot say: a pool member's age only with a warm start, and always with one.
  const result = response.result;
  if (result.member_age_ms !== undefined && result.start !== "warm") {
    throw new MayHaveRunError(
      "bad_response",
      `the code may have run: the result for request ${id} is malformed: \`member_age_ms\` is present but \`start\` is ${result.start === undefined ? "absent" : `"${result.start}"`}, not "warm" (only a warm start has a pool member's age)`,
      id,
      { status: 200 },
    );
  }
  if (result.start === "warm" && result.member_age_ms === undefined) {
    throw new MayHaveRunError(
      "bad_response",
      `the code may have run: the result for request ${id} is malformed: \`start\` is "warm" but \`member_age_ms\` is absent (a warm start always says how long its pool member waited)`,
      id,
      { status: 200 },
    );
  }

  const requestSha = requestSha256(sent);
  if (requestSha !== response.request_sha256) {
    throw new DigestMismatchError("request", requestSha, response.request_sha256, id);
  }
  const resultSha = resultSha256(response.result);
  if (resultSha !== response.result_sha256) {
    throw new DigestMismatchError("result", resultSha, response.result_sha256, id);
  }
  const record = response.record;
  const recordSha = recordSha256(record);
  if (recordSha !== record.record_sha256) {
    throw new DigestMismatchError("record", recordSha, record.record_sha256, id);
  }

  const agree = (field: string, inResponse: string, inRecord: string): void => {
    if (inResponse !== inRecord) {
      throw new RecordMismatchError(field, inResponse, inRecord, id);
    }
  };
  agree("request_sha256", requestSha, record.request_sha256);
  agree("result_sha256", resultSha, record.result_sha256);
  agree("provider", response.provider, record.provider);
  agree("isolation", response.isolation, record.isolation);
  return response;
}
