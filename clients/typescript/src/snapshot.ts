/**
 * The checks on snapshots and on the sessions opened from them (docs/sessions.md, "Snapshots
 * and forks"). A restored or forked session goes on from its parent's chain: its `origin`
 * names the snapshot, the parent and the parent's place in its chain, its own chain starts
 * there (`calls` = `parent_calls`, last record = `parent_record_sha256`), and every record of
 * its calls carries the same origin, inside the record digest (field 14). A session restored
 * under its own id by a daemon restart changes its origin once, at the call after its last
 * saved one: {@link restoreBoundaryDifference} says whether a record is that call.
 * @module
 */

import { EvidenceMismatchError, MayHaveRunError, SessionMismatchError } from "./errors.js";
import { PROTOCOL, type SessionInfo, type SessionOrigin, type SnapshotInfo, isSessionId, isSnapshotId, tierRank } from "./types.js";

/** The members of an origin, in the order the record digest encodes them. */
const ORIGIN_MEMBERS = ["start", "snapshot_sha256", "parent_session_id", "parent_record_sha256", "parent_calls"] as const;

const SHA256 = /^[0-9a-f]{64}$/;

/** What an origin must say: each member given must be that value (`undefined`: absent). */
export type OriginWanted = Partial<SessionOrigin> & Pick<SessionOrigin, "start">;

/** Where two origins first differ: `origin` when one of them is absent, else `origin.<member>`. */
export interface OriginDifference {
  field: string;
  expected: string | undefined;
  found: string | undefined;
}

function shown(v: string | number | undefined): string | undefined {
  return v === undefined ? undefined : String(v);
}

/** An origin in one line, for messages. */
export function describeOrigin(o: SessionOrigin | undefined): string | undefined {
  if (o === undefined) return undefined;
  return `${o.start} from ${o.parent_session_id} at call ${o.parent_calls} (record ${o.parent_record_sha256 ?? "none"}, snapshot ${o.snapshot_sha256})`;
}

/**
 * Where `found` is not what `wanted` says: only the members `wanted` has are compared, so a
 * whole origin compares all of them. `undefined` when they agree.
 */
export function originDifference(wanted: OriginWanted | SessionOrigin | undefined, found: SessionOrigin | undefined): OriginDifference | undefined {
  if (wanted === undefined || found === undefined) {
    return wanted === found ? undefined : { field: "origin", expected: describeOrigin(wanted as SessionOrigin | undefined), found: describeOrigin(found) };
  }
  for (const k of ORIGIN_MEMBERS) {
    if (Object.hasOwn(wanted, k) && wanted[k] !== found[k]) {
      return { field: `origin.${k}`, expected: shown(wanted[k]), found: shown(found[k]) };
    }
  }
  return undefined;
}

/**
 * Whether `origin`, on the record at `sequence` of session `id` whose chain stood at
 * `previous` (the last record's digest), is that session restored under its own id right
 * after its last call: a daemon restart saved it and the next daemon restored it
 * (docs/sessions.md, "Across a restart"). `undefined` when it is; else the first member that
 * says otherwise (`origin` when there is none), for the mismatch.
 */
export function restoreBoundaryDifference(
  origin: SessionOrigin | undefined,
  id: string,
  sequence: number,
  previous: string | undefined,
): OriginDifference | undefined {
  if (origin === undefined) return { field: "origin", expected: `restored from ${id} at call ${sequence - 1}`, found: undefined };
  const wanted: [keyof SessionOrigin, string | number | undefined][] = [
    ["start", "restored"],
    ["parent_session_id", id],
    ["parent_calls", sequence - 1],
    ["parent_record_sha256", previous],
  ];
  for (const [k, v] of wanted) {
    if (origin[k] !== v) return { field: `origin.${k}`, expected: shown(v), found: shown(origin[k]) };
  }
  return undefined;
}

/**
 * Whether a session shown as `origin` (by `GET /v1/sessions/{id}`) was restored under its own
 * id `id` since this client saw its call `seen`: restored, from itself, after that call or a
 * later one (calls made elsewhere before the restart are taken on the daemon's word, as a
 * resync takes them).
 */
export function restoredSince(origin: SessionOrigin | undefined, id: string, seen: number): boolean {
  return origin !== undefined && origin.start === "restored" && origin.parent_session_id === id && origin.parent_calls >= seen;
}

/**
 * The checks any snapshot answer must pass on its own: its protocol, its ids and digests well
 * formed, and a chain position that can stand (a last record exactly when there were calls).
 */
export function checkSnapshotShape(info: SnapshotInfo, bad: (what: string) => Error): void {
  if (info.protocol !== PROTOCOL) throw bad(`the snapshot speaks protocol ${info.protocol}, this client protocol ${PROTOCOL}`);
  if (!isSnapshotId(info.snapshot_id)) throw bad(`${JSON.stringify(info.snapshot_id)} is not a snapshot id`);
  if (!isSessionId(info.session_id)) throw bad(`snapshot ${info.snapshot_id} names ${JSON.stringify(info.session_id)}, not a session id`);
  if (!SHA256.test(info.sha256)) throw bad(`snapshot ${info.snapshot_id}'s sha256 ${JSON.stringify(info.sha256)} is not 64 lowercase hex digits`);
  if ((info.calls === 0) !== (info.last_record_sha256 === undefined)) {
    throw bad(
      `snapshot ${info.snapshot_id} was taken after ${info.calls} calls with ${info.last_record_sha256 === undefined ? "no" : "a"} last record: a chain cannot stand so`,
    );
  }
}

/** What a copy is held to besides its origin: the session (or snapshot) it came from. */
export interface CopyParent {
  language: SessionInfo["language"];
  provider: string;
  /** The floor it was opened with, when known: a copy keeps it. */
  minimum_isolation?: SessionInfo["minimum_isolation"];
}

/**
 * Checks a session just restored or forked from a snapshot (`info`, its answer already read):
 * new and open, its origin there and saying what `wanted` says, its chain starting where its
 * origin says, its language and provider its parent's, its tier meeting its floor. A
 * difference is a {@link SessionMismatchError} (or an {@link EvidenceMismatchError} for the
 * tier); `what` names the copy in messages (`copy 2 of the fork`, `the restored session`).
 */
export function checkCopy(
  info: SessionInfo,
  wanted: OriginWanted,
  parent: CopyParent | undefined,
  requestId: string,
  what: string,
  status: number,
  mayHave: string,
): SessionOrigin {
  const mismatch = (field: string, expected: string | undefined, found: string | undefined, why: string): never => {
    throw new SessionMismatchError(field, expected, found, requestId, `${what}: ${why}`);
  };
  const diff = originDifference(wanted, info.origin);
  if (diff !== undefined) {
    mismatch(diff.field, diff.expected, diff.found, "its origin is not the snapshot and the session it was opened from");
  }
  const origin = info.origin!;
  const chain = "a copy's chain goes on from its parent's at the snapshot, as its origin says";
  if (info.calls !== origin.parent_calls) mismatch("calls", String(origin.parent_calls), String(info.calls), chain);
  if (info.last_record_sha256 !== origin.parent_record_sha256) {
    mismatch("last_record_sha256", origin.parent_record_sha256, info.last_record_sha256, chain);
  }
  if (info.end_reason !== undefined || !info.interpreter_alive) {
    throw new MayHaveRunError(
      "bad_response",
      `${mayHave}: ${what} is shown ${info.end_reason === undefined ? "with its interpreter ended" : `ended (${info.end_reason})`}, not new (request ${requestId})`,
      requestId,
      { status },
    );
  }
  if (parent !== undefined) {
    const same = "a copy runs where its parent ran";
    if (info.language !== parent.language) mismatch("language", parent.language, info.language, same);
    if (info.provider !== parent.provider) mismatch("provider", parent.provider, info.provider, same);
    if (parent.minimum_isolation !== undefined && info.minimum_isolation !== parent.minimum_isolation) {
      mismatch("minimum_isolation", parent.minimum_isolation, info.minimum_isolation, "a copy keeps its parent's floor");
    }
  }
  if (tierRank(info.isolation) < tierRank(info.minimum_isolation)) {
    throw new EvidenceMismatchError(info.provider, info.isolation, info.minimum_isolation, "session", requestId);
  }
  return origin;
}
