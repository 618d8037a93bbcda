/**
 * The wire types of protocol 1 (docs/protocol.md), with the JSON member names as they travel.
 * Bytes are `Uint8Array`s, decoded from either wire form; optional members the daemon left out
 * (or sent as `null`) are `undefined`; members with a default carry it.
 * @module
 */

/** The protocol this client speaks. */
export const PROTOCOL = 1;

/** An isolation tier, weakest first. */
export type Tier = "process" | "container" | "kernel" | "vm";

/** Every tier, weakest first. */
export const TIERS: readonly Tier[] = ["process", "container", "kernel", "vm"];

/** The rank of a tier (`process` is 0): tiers compare by it. */
export function tierRank(t: Tier): number {
  return TIERS.indexOf(t);
}

/**
 * How a run's sandbox started: `warm`, a fresh sandbox started ahead of the request and used
 * for exactly one run, or `cold`, one started for the request.
 */
export type Start = "warm" | "cold";

/** Every start. */
export const STARTS: readonly Start[] = ["warm", "cold"];

/**
 * Which kind of credential the broker attached to a grant's call: `static`, the profile's
 * static secret (development only, the same on every call of every run), or `minted`, a
 * short-lived JWT minted for the run.
 */
export type CredentialKind = "static" | "minted";

/** Every credential kind. */
export const CREDENTIAL_KINDS: readonly CredentialKind[] = ["static", "minted"];

/** Why nothing ran: the reason of a "not dispatched" mark. */
export type Reason =
  | "request"
  | "permission"
  | "protocol"
  | "unsupported"
  | "isolation"
  | "environment"
  | "capacity";

/** Every reason. */
export const REASONS: readonly Reason[] = [
  "request",
  "permission",
  "protocol",
  "unsupported",
  "isolation",
  "environment",
  "capacity",
];

/**
 * Why a session, or its interpreter, ended (docs/sessions.md, "Ends"). `interpreter_crash`,
 * `out_of_memory` and `cell_timeout` end only the interpreter; the others the session.
 */
export type EndReason =
  | "closed"
  | "idle_timeout"
  | "max_lifetime"
  | "interpreter_crash"
  | "out_of_memory"
  | "cell_timeout"
  | "sandbox_changed"
  | "daemon_restarted"
  | "sandbox_failed";

/** Every end reason, in the order docs/sessions.md lists them. */
export const END_REASONS: readonly EndReason[] = [
  "closed",
  "idle_timeout",
  "max_lifetime",
  "interpreter_crash",
  "out_of_memory",
  "cell_timeout",
  "sandbox_changed",
  "daemon_restarted",
  "sandbox_failed",
];

/**
 * How a trial ended (a trial step's verdict, docs/trials.md): `completed` or `failed` by the
 * simulator, or one of the controller's faults, after which the trial never passes.
 */
export type TrialEnd =
  | "completed"
  | "failed"
  | "controller_timeout"
  | "controller_garbage"
  | "controller_exited"
  | "controller_flood";

/** Every trial end. */
export const TRIAL_ENDS: readonly TrialEnd[] = [
  "completed",
  "failed",
  "controller_timeout",
  "controller_garbage",
  "controller_exited",
  "controller_flood",
];

/** A snippet language, as the wire names it. */
export type Language = "javascript" | "python";

/** Limits a request asks for; each a whole number greater than 0. */
export interface Limits {
  timeout_ms?: number;
  memory_bytes?: number;
  output_bytes?: number;
  pids?: number;
  disk_bytes?: number;
  artifact_bytes?: number;
}

/** The limit names, in the order the request digest encodes them. */
export const LIMIT_NAMES = [
  "timeout_ms",
  "memory_bytes",
  "output_bytes",
  "pids",
  "disk_bytes",
  "artifact_bytes",
] as const;

/** A piece of code in one language. */
export interface Snippet {
  kind: "snippet";
  language: Language;
  code: string;
}

/** A file written under /work before the first step. */
export interface ProjectFile {
  /** Relative to /work, `/`-separated. */
  path: string;
  /** The exact bytes; a string stands for its UTF-8. */
  content: Uint8Array | string;
  /** Default `false`. */
  executable?: boolean;
}

/** A shell step, run by `/bin/sh -c` in /work. */
export interface Step {
  /** A label for people. */
  name?: string;
  /** The command. */
  run: string;
}

/** Files written under /work, shell steps run in order, artifacts returned. */
export interface Project {
  kind: "project";
  files?: ProjectFile[];
  steps: Step[];
  /** Paths under /work to return after the steps, in this order. */
  artifacts?: string[];
}

/** What to run. */
export type RunSpec = Snippet | Project;

/** A run request as this client sent it (read back from the bytes sent). */
export interface RunRequest {
  protocol: number;
  request_id: string;
  minimum_isolation?: Tier;
  provider?: string;
  limits?: Limits;
  run: SentRunSpec;
  grant?: string;
  /** The image to run in: an image name or an image identity (`sha256:...`). */
  image?: string;
}

/** A run spec as sent: every default filled in, contents as bytes. */
export type SentRunSpec = Snippet | SentProject;

/** A project as sent. */
export interface SentProject {
  kind: "project";
  files: { path: string; content: Uint8Array; executable: boolean }[];
  steps: Step[];
  artifacts: string[];
}

/** The outcome members a run's result and each of its steps share. */
export interface Outcome {
  /** The exit status; `null` when a signal ended it. */
  exit_code: number | null;
  /** The signal that ended it, if one did. */
  signal?: number;
  timed_out: boolean;
  oom_killed: boolean;
  stdout: Uint8Array;
  stdout_truncated: boolean;
  stderr: Uint8Array;
  stderr_truncated: boolean;
}

/** One project step that ran. */
export interface StepResult extends Outcome {
  name?: string;
  /** Not covered by the result digest. */
  duration_ms: number;
}

/** A returned project file. */
export interface Artifact {
  path: string;
  /** `false` when the file did not exist or was not a regular file. */
  found: boolean;
  /** Its size on disk. */
  size: number;
  /** At most the artifact limit. */
  content: Uint8Array;
  truncated: boolean;
}

/** One call a run made through its grant's broker. */
export interface GrantCall {
  method: string;
  route?: string;
  status?: number;
  error?: string;
  request_bytes: number;
  response_bytes: number;
  /** Not covered by the result digest. */
  latency_ms: number;
  /**
   * The kind of credential the broker attached. Optional when read, so that an older result
   * parses; the daemon sets it on every call it lists. Inside the result digest.
   */
  credential?: CredentialKind;
}

/**
 * One connection the run's code asked the broker for through its egress proxy, allowed or
 * refused (docs/protocol.md, EgressReceipt). Every member is inside the result digest, the
 * times included. `kind`, `verdict`, `rule` and `ended` are the strings sent, so a value a
 * later daemon adds still reads.
 */
export interface EgressReceipt {
  /**
   * The host the code named (lowercased), or the IP literal or the target as sent (at most
   * 255 bytes) when it was refused before it parsed.
   */
  host: string;
  /** The port the code named; 0 when it named none that parsed. */
  port: number;
  /** `connect` (a CONNECT tunnel) or `http` (one plain-HTTP request). */
  kind: string;
  /** The address the broker connected to, `ip:port` (`[v6]:port`); absent when it connected to none. */
  address?: string;
  /** The server name the TLS ClientHello carried; absent for plain HTTP or when none was read. */
  sni?: string;
  /** Bytes from the code to the host. */
  bytes_up: number;
  /** Bytes from the host to the code. */
  bytes_down: number;
  /** When the broker accepted the request, in milliseconds from the run's start. */
  start_ms: number;
  /** When the connection ended, in milliseconds from the run's start. */
  end_ms: number;
  /** `allowed` or `refused`. */
  verdict: string;
  /**
   * What decided: for `allowed`, the rule that allowed it (`host *.example.com port 443`, with
   * ` via <range>` when an address range let a non-public address through); for `refused`,
   * the check's code (`host_not_allowed`, `ip_literal`, ...).
   */
  rule: string;
  /** How an allowed connection ended (`closed`, `deadline`, `budget_bytes`, ...); absent for a refused one. */
  ended?: string;
}

/** What a run produced. */
export interface RunResult extends Outcome {
  steps: StepResult[];
  artifacts: Artifact[];
  calls: GrantCall[];
  /**
   * Every connection the code asked the broker's egress proxy for, allowed or refused, in the
   * order the broker took them (`[]` without an egress grant). Inside the result digest
   * (field 17), the times included.
   */
  egress: EgressReceipt[];
  /**
   * How the sandbox started. Optional when read, so that an older result parses; every
   * result the daemon writes now has it.
   */
  start?: Start;
  /**
   * How long the warm pool member waited between being started and being claimed, in
   * milliseconds; present exactly when `start` is `warm` (a verified response is checked).
   */
  member_age_ms?: number;
  /**
   * What the sandbox looked like just before its code was handed over; absent where the
   * provider reads none. Inside the result digest.
   */
  wall?: Wall;
  /**
   * A session's cell only: whether the interpreter's state from earlier cells was there for
   * this one (`false` when it ended during this cell, or when this cell started a fresh
   * one). Absent outside cells. Inside the result digest (field 15).
   */
  state_kept?: boolean;
  /**
   * A session's cell only: why its interpreter ended during this cell (`interpreter_crash`,
   * `out_of_memory`, `cell_timeout`); its state is lost, and the next cell must ask for a
   * restart. Absent when it did not end. Inside the result digest (field 16).
   */
  interpreter_end?: EndReason;
}

/** One namespace of a run's sandbox. */
export interface WallNamespace {
  /** Its kind, as /proc names it (`mnt`, `net`, `pid`, ...). */
  name: string;
  /** Its identity (`net:[4026532281]`). */
  id: string;
  /** Whether it is the daemon's own; absent where comparing says nothing (a guest kernel's). */
  same_as_host?: boolean;
}

/**
 * A run's sandbox as /proc showed it for the process that ran the code, just before the code
 * was handed over (docs/protocol.md, Wall). A capability set, `no_new_privs` or `seccomp`
 * is absent where the kernel shows no such line (gVisor).
 */
export interface Wall {
  uid: number;
  euid: number;
  gid: number;
  groups: number[];
  /** The capability sets, 16 hex digits each. */
  cap_inh?: string;
  cap_prm?: string;
  cap_eff?: string;
  cap_bnd?: string;
  cap_amb?: string;
  no_new_privs?: boolean;
  /** 0 none, 1 strict, 2 filter. */
  seccomp?: number;
  namespaces: WallNamespace[];
  root_read_only: boolean;
  network_interfaces: string[];
  memory_limit_bytes?: number;
  pids_limit?: number;
}

/** The run record: the facts a signer needs, with a digest over them. */
export interface RunRecord {
  request_id: string;
  request_sha256: string;
  result_sha256: string;
  provider: string;
  isolation: Tier;
  /**
   * The floor the daemon held the run to: the one sent, or its default floor when none was.
   * Optional when read, so that an older record parses; a verified response always has it.
   */
  minimum_isolation?: Tier;
  evidence_sha256: string;
  environment: string;
  started_unix_ms: number;
  ended_unix_ms: number;
  /** A session call's place in its session's chain; absent for a run outside a session. */
  session?: SessionLink;
  /**
   * The image the code ran in (its name and identity); absent at the process tier (which has
   * no image) and in records written before the member existed. Inside the record digest
   * (field 12).
   */
  image?: ImageRef;
  /**
   * What each trial step's verdict said, in step order (`[]` for a run without trial steps,
   * and when absent or `null`). Inside the record digest (field 13).
   */
  trials: TrialStepRecord[];
  record_sha256: string;
}

/**
 * One trial step of a project, as the record carries its verdict: the step's index among the
 * project's steps (from 0), the simulator, whether every trial passed, and each trial's
 * outcome, in the order the step named its scenarios.
 */
export interface TrialStepRecord {
  step: number;
  simulator: SimulatorRef;
  pass: boolean;
  trials: TrialOutcome[];
}

/** The simulator a trial step ran: its metadata's name and version, its module's SHA-256. */
export interface SimulatorRef {
  name: string;
  version: string;
  sha256: string;
}

/**
 * How one trial (one scenario) ended: the scenario's name (never its file's), the end, the
 * reason in words, the ticks run, the simulator's score (absent from a simulator that does not
 * score; a finite number, digested by its IEEE 754 bits, so `-0` is not `0`), whether it
 * passed, and the SHA-256 of its trajectory.
 */
export interface TrialOutcome {
  scenario?: string;
  end: TrialEnd;
  reason?: string;
  ticks: number;
  score?: number;
  pass: boolean;
  fingerprint: string;
}

/**
 * An image as a record or a session names it: its `name` in the daemon's image store and its
 * `identity` (`sha256:` over its manifest, the record's `environment`).
 */
export interface ImageRef {
  name: string;
  identity: string;
}

/** One image the daemon keeps, as `GET /v1/providers` lists it. */
export interface ImageInfo {
  /** Its name: a request's `image` may name it so. */
  name: string;
  /** Its identity (`sha256:` and 64 lowercase hex digits): a request's `image` may name it so too. */
  identity: string;
  /** Whether a request that names no image gets it. */
  default: boolean;
  /** The languages its check found in it. */
  languages: Language[];
  /** Whether the VM provider can boot it (it has a disk made from it). */
  vm_disk: boolean;
  /** The trial simulators it declares (docs/simulators.md), in its index's order; `[]` when none. */
  simulators: SimulatorEntry[];
}

/** A trial simulator an image declares (docs/simulators.md). */
export interface SimulatorEntry {
  /** The name a trial names it by (`[a-z0-9][a-z0-9._-]{0,63}`). */
  name: string;
  /** Its WebAssembly module's path inside the image. */
  path: string;
  /** The module's SHA-256 (64 lowercase hex digits): what a trial's record names as `simulator.sha256`. */
  sha256: string;
}

/** The longest image name. */
export const IMAGE_NAME_MAX = 64;

/**
 * Whether `s` is an image name: 1 to 64 characters of `a-z 0-9 . _ -`, the first a letter or
 * a digit. A name never holds `:`, so a selector with one is an identity.
 */
export function isImageName(s: string): boolean {
  return s.length <= IMAGE_NAME_MAX && /^[a-z0-9][a-z0-9._-]*$/.test(s);
}

/** Whether `s` is an image identity: `sha256:` and 64 lowercase hex digits. */
export function isImageIdentity(s: string): boolean {
  return /^sha256:[0-9a-f]{64}$/.test(s);
}

/** Whether a request's `image` (`selector`, a name or an identity) names this image. */
export function imageAnswers(image: ImageRef | ImageInfo, selector: string): boolean {
  return image.name === selector || image.identity === selector;
}

/** A session call's place in its session's chain (docs/sessions.md, "Chained records"). */
export interface SessionLink {
  /** The session's id. */
  session_id: string;
  /** 1 for the session's first call, then one more each. */
  sequence: number;
  /** The record digest of the session's previous call; absent exactly for sequence 1. */
  previous_record_sha256?: string;
  /**
   * Where a restored or forked session came from: on every call record of such a session,
   * equal to its `SessionInfo.origin`; absent for a session opened fresh. Inside the record
   * digest (field 14).
   */
  origin?: SessionOrigin;
}

/** A verified `200` answer: the run happened, on `provider` at tier `isolation`. */
export interface RunResponse {
  protocol: number;
  request_id: string;
  provider: string;
  isolation: Tier;
  duration_ms: number;
  request_sha256: string;
  result_sha256: string;
  result: RunResult;
  record: RunRecord;
}

/** Any answer that is not a run response. */
export interface ErrorResponse {
  protocol: number;
  request_id: string | null;
  error: {
    code: string;
    message: string;
    /** The not-dispatched mark: set only when certainly nothing ran. */
    not_dispatched: Reason | null;
    /**
     * For a call to a session that has ended (codes `session_ended`, `sandbox_changed`, or
     * `session_not_found` after a daemon restart): why it ended.
     */
    end_reason?: EndReason;
  };
}

/** A binary a provider's wall rests on. */
export interface BinaryIdentity {
  name: string;
  path: string;
  version: string;
  sha256: string;
}

/** A namespace as the probe saw it. */
export interface NamespaceSeen {
  id: string;
  same_as_host?: boolean;
}

/** What the probe reported from inside the wall. */
export interface ProbeReport {
  uid: number;
  euid: number;
  gid: number;
  groups: number[];
  capabilities: Record<string, string>;
  no_new_privs: boolean;
  seccomp_mode: number;
  environment: string[];
  cwd: string;
  namespaces: Record<string, NamespaceSeen>;
  mounts: Record<string, string>;
  write_attempts: Record<string, string>;
  read_attempts: Record<string, string>;
  network_interfaces: string[];
  socket_attempts: Record<string, string>;
  limits: Record<string, string>;
  kernel_release: string;
  hostname: string;
}

/** What the daemon checked about a provider (not attestation: it cannot prove the host honest). */
export interface Evidence {
  provider: string;
  isolation: Tier;
  config: Record<string, string>;
  binaries: BinaryIdentity[];
  probe?: ProbeReport;
  checks: Record<string, string>;
  environment: string;
  checked_unix_ms: number;
}

/** One provider of the daemon. */
export interface ProviderInfo {
  name: string;
  isolation: Tier;
  available: boolean;
  unavailable_reason?: string;
  evidence: Evidence;
  /** Checked by this client against `evidence`. */
  evidence_sha256: string;
}

/** The answer to `GET /v1/providers`. */
export interface ProvidersResponse {
  protocol: number;
  /** The floor a request gets when it sets none. */
  default_floor: Tier;
  /** Cheapest first. */
  providers: ProviderInfo[];
  /**
   * The images a request may name, the default one marked (empty from a daemon without
   * images). {@link imageAnswers} finds the one a selector names.
   */
  images: ImageInfo[];
}

// ---------------------------------------------------------------------------------------
// Sessions (docs/sessions.md).

/** A session as `POST /v1/sessions`, `GET /v1/sessions[/{id}]` and `DELETE` show it. */
export interface SessionInfo {
  protocol: number;
  /** The request id of the request this answers (`POST` and `DELETE`); absent on `GET`. */
  request_id?: string;
  /** `ses_` + 16 hex digits (the daemon instance) + `_` + 32 hex digits. */
  session_id: string;
  /** Its interpreter's language. */
  language: Language;
  /** The provider it runs at. */
  provider: string;
  /** That provider's tier, measured at open; every call's floor is checked against it. */
  isolation: Tier;
  /** The floor it was opened with (the one sent, or the daemon's default). */
  minimum_isolation: Tier;
  /** Digest of the provider's evidence at open; every call's record names it. */
  evidence_sha256: string;
  /** What it runs on: the sandbox image's identity. */
  environment: string;
  /** The image it runs in, fixed at open (every call's record names it too); absent from a daemon without images. */
  image?: ImageRef;
  /** Its sandbox at open: what every call's re-check compares with. */
  wall: Wall;
  opened_unix_ms: number;
  /** When its maximum lifetime ends. */
  expires_unix_ms: number;
  idle_timeout_ms: number;
  /** How many calls it has answered (the sequence number of the last record). */
  calls: number;
  /** The record digest of its last call; absent before the first. */
  last_record_sha256?: string;
  /** Whether its interpreter is alive with its state. */
  interpreter_alive: boolean;
  /** Why it ended; absent while it is open. */
  end_reason?: EndReason;
  /**
   * Where it came from when it was restored or forked from a snapshot (every call's record
   * says the same); absent for a session opened fresh.
   */
  origin?: SessionOrigin;
}

/** The answer to `GET /v1/sessions`: the caller's own open sessions, oldest first. */
export interface SessionList {
  protocol: number;
  sessions: SessionInfo[];
}

// ---------------------------------------------------------------------------------------
// Snapshots and forks (docs/sessions.md, "Snapshots and forks").

/**
 * How a session that did not open fresh began: `restored`, opened from a snapshot (or the same
 * session brought back after a daemon restart), or `forked`, one copy of a fork.
 */
export type SessionStart = "restored" | "forked";

/** Every session start. */
export const SESSION_STARTS: readonly SessionStart[] = ["restored", "forked"];

/** Whether `s` is a session id: `ses_`, 16 lowercase hex digits, `_`, 32 more. */
export function isSessionId(s: string): boolean {
  return /^ses_[0-9a-f]{16}_[0-9a-f]{32}$/.test(s);
}

/** Whether `s` is a snapshot id: `snp_`, 16 lowercase hex digits, `_`, 32 more. */
export function isSnapshotId(s: string): boolean {
  return /^snp_[0-9a-f]{16}_[0-9a-f]{32}$/.test(s);
}

/**
 * Where a restored or forked session came from: on its `SessionInfo`, and on every one of its
 * calls' records, inside the record digest (field 14). Its chain goes on from its parent's:
 * its first call is sequence `parent_calls + 1`, after `parent_record_sha256`.
 */
export interface SessionOrigin {
  start: SessionStart;
  /** The snapshot's digest (over its files), recomputed when it was restored. */
  snapshot_sha256: string;
  /** The session the snapshot was taken of. */
  parent_session_id: string;
  /** The parent's last record digest at the snapshot; absent when it had answered no call. */
  parent_record_sha256?: string;
  /** The parent's call count at the snapshot. */
  parent_calls: number;
}

/**
 * A snapshot, as `POST /v1/sessions/{id}/snapshot`, `GET /v1/snapshots` and
 * `DELETE /v1/snapshots/{id}` show it (and a fork's answer).
 */
export interface SnapshotInfo {
  protocol: number;
  /** The request id of the request this answers (`POST` and `DELETE`); absent in a list. */
  request_id?: string;
  /** `snp_` + 16 hex digits (the daemon instance) + `_` + 32 hex digits. */
  snapshot_id: string;
  /** The session it was taken of. */
  session_id: string;
  /** SHA-256 over its files (64 lowercase hex digits): what a session opened from it names. */
  sha256: string;
  /** Its size on disk: what counts against the snapshot quotas. */
  bytes: number;
  /** The provider whose sandbox it holds. */
  provider: string;
  /** That provider's tier. */
  isolation: Tier;
  /** The session's interpreter. */
  language: Language;
  /** The session's call count when it was taken. */
  calls: number;
  /** The session's last record digest when it was taken; absent before its first call. */
  last_record_sha256?: string;
  /** How long the checkpoint took, milliseconds. */
  checkpoint_ms: number;
  created_unix_ms: number;
  /** When it is removed. */
  expires_unix_ms: number;
}

/** The answer to `GET /v1/snapshots`: the caller's own snapshots, oldest first. */
export interface SnapshotList {
  protocol: number;
  snapshots: SnapshotInfo[];
}

/**
 * The answer to `POST /v1/sessions/{id}/fork`: the snapshot taken of the session (kept until
 * it expires or is deleted) and the copies, each a new session whose `origin.start` is
 * `forked`.
 */
export interface ForkAnswer {
  protocol: number;
  request_id: string;
  snapshot: SnapshotInfo;
  sessions: SessionInfo[];
}

/** Which stream a chunk of output came from. */
export type OutputStream = "stdout" | "stderr";

/**
 * A chunk of a streamed call's output as it came: a **preview**, covered by no digest (the
 * final, verified result holds the whole output).
 */
export interface OutputChunk {
  /** Always `true`: a chunk is a preview. */
  preview: true;
  stream: OutputStream;
  /** Bytes of this stream before the chunk, in the call (for steps, across its steps). */
  offset: number;
  bytes: Uint8Array;
}

/** One line of a streamed answer: a chunk, then exactly one response or error. */
export type StreamLine =
  | { chunk: OutputChunk }
  | { response: RunResponse }
  | { error: ErrorResponse };
