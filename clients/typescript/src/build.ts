/**
 * Building a request's JSON: the checks a server makes that need no settings, so that a
 * malformed request is refused here ("not dispatched", nothing sent) with a message saying
 * what to fix.
 * @module
 */

import { bytesToWire, utf8 } from "./bytes.js";
import { IMAGE_NAME_MAX, LIMIT_NAMES, PROTOCOL, TIERS, isImageIdentity, isImageName } from "./types.js";
import type { RunOptions } from "./client.js";

/** A request this client refuses to send, and why. */
export class RequestShapeError extends Error {}

export function fail(message: string): never {
  throw new RequestShapeError(message);
}

/** Blank as the daemon reads it: nothing but Unicode White_Space. */
function blank(s: string): boolean {
  return /^\p{White_Space}*$/u.test(s);
}

export function text(v: unknown, what: string): string {
  if (typeof v !== "string") fail(`${what} must be a string`);
  if (!v.isWellFormed()) fail(`${what} holds a lone surrogate: it is not valid Unicode and has no UTF-8`);
  return v;
}

export function only(v: unknown, what: string, allowed: readonly string[]): Record<string, unknown> {
  if (typeof v !== "object" || v === null || Array.isArray(v)) fail(`${what} must be an object`);
  for (const k of Object.keys(v)) {
    if (!allowed.includes(k)) fail(`${what} has an unknown member \`${k}\` (allowed: ${allowed.join(", ")})`);
  }
  return v as Record<string, unknown>;
}

export function projectPath(v: unknown, what: string): string {
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

/**
 * A run's JSON. In a session (`inSession`) a project's steps may be empty when it has files
 * or artifacts (docs/sessions.md).
 */
export function buildRun(v: unknown, inSession = false): Record<string, unknown> {
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
  if (p.steps !== undefined && !Array.isArray(p.steps)) fail("run.steps must be a list");
  const steps: unknown[] = p.steps ?? [];
  const hasFiles = Array.isArray(p.files) && p.files.length > 0;
  const hasArtifacts = Array.isArray(p.artifacts) && p.artifacts.length > 0;
  if (steps.length === 0 && !(inSession && (hasFiles || hasArtifacts))) {
    fail(
      inSession
        ? "run.steps is empty: a session's steps call needs a step, a file or an artifact"
        : "run.steps is empty: a project needs at least one step",
    );
  }
  out.steps = steps.map((s: unknown, i) => {
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
export function buildRequest(options: RunOptions, requestId: string): Record<string, unknown> {
  const o = only(options, "the run options", ["run", "minimum_isolation", "provider", "limits", "grant", "image", "signal"]);
  const wire: Record<string, unknown> = { protocol: PROTOCOL, request_id: requestId };
  if (o.minimum_isolation !== undefined) wire.minimum_isolation = tier(o.minimum_isolation, "minimum_isolation");
  if (o.provider !== undefined) wire.provider = provider(o.provider);
  if (o.limits !== undefined) wire.limits = buildLimits(o.limits);
  wire.run = buildRun(o.run);
  if (o.grant !== undefined) {
    if (text(o.grant, "grant") === "") fail("grant must not be empty: omit it for a run without grants");
    wire.grant = o.grant;
  }
  if (o.image !== undefined) wire.image = image(o.image);
  return wire;
}

/** An image selector, checked: an image name or an image identity. */
export function image(v: unknown): string {
  const s = text(v, "image");
  if (!isImageName(s) && !isImageIdentity(s)) {
    fail(
      `image ${JSON.stringify(s)} is neither an image name (1 to ${IMAGE_NAME_MAX} characters of a-z 0-9 . _ -, starting with a letter or digit) nor an identity (sha256: and 64 lowercase hex characters): providers().images lists the daemon's images`,
    );
  }
  return s;
}

/** A tier, checked. */
export function tier(v: unknown, what: string): string {
  if (!(TIERS as readonly unknown[]).includes(v)) {
    fail(`${what} must be one of ${TIERS.join(", ")}, not ${JSON.stringify(v)}`);
  }
  return v as string;
}

/** A provider's name, checked. */
export function provider(v: unknown): string {
  if (text(v, "provider") === "") fail("provider must not be empty: omit it to let the daemon choose");
  return v as string;
}

/** A whole number above 0 that a JavaScript number holds exactly. */
export function positive(v: unknown, what: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v <= 0) {
    fail(`${what} must be a whole number greater than 0, not ${String(v)}`);
  }
  return v;
}

/** Limits, checked, in the order the digest encodes them. */
export function buildLimits(v: unknown): Record<string, number> {
  const l = only(v, "limits", LIMIT_NAMES);
  const out: Record<string, number> = {};
  for (const k of LIMIT_NAMES) {
    if (l[k] !== undefined) out[k] = positive(l[k], `limits.${k}`);
  }
  return out;
}
