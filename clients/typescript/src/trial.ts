/**
 * Trials (docs/simulators.md, docs/trials.md): a controller against a simulator its image
 * carries, sent as a project of one trial step: the request `plimsoll trial` builds
 * (crates/cli/src/trial.rs), so every client and the CLI send the same bytes for one trial.
 * @module
 */

import { fail } from "./build.js";
import type { Project, ProjectFile } from "./types.js";

/** The first word of a trial step. */
export const TRIAL_RUNNER = "plimsoll-trial-runner";

/** A trial: the simulator, the controller and the scenarios, and the runner's options. */
export interface TrialSpec {
  /** The simulator, by the name the image declares it under (`providers().images[i].simulators`). */
  simulator: string;
  /** The SHA-256 (64 lowercase hex digits) its module must have. */
  simulator_sha256?: string;
  /**
   * The controller: `path` is its file name (`*.js`, `*.mjs`, `*.cjs`: run by node; `*.py`:
   * run by python3), `content` its code.
   */
  controller: ProjectFile;
  /** The scenarios (at least one): each a file name and the scenario's JSON. */
  scenarios: ProjectFile[];
  /** The answer deadline of the first tick, in ms (the runner's default: 1000). */
  first_deadline_ms?: number;
  /** The answer deadline of every later tick, in ms (the runner's default: 100). */
  tick_deadline_ms?: number;
  /** The verdict leaves its wall time out, so identical trials give identical results. */
  reproducible?: boolean;
}

// The runner's words are plain: a trial step is not run by a shell (docs/trials.md), so a file
// name with anything else could not be passed to it. No `/`: a name is one file in /work.
// A leading `-` would make the name read as one of the runner's options.
const PLAIN = /^[A-Za-z0-9_.,:=+@%][A-Za-z0-9\-_.,:=+@%]*$/;
const SIMULATOR = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const INTERPRETERS: Record<string, string> = { js: "node", mjs: "node", cjs: "node", py: "python3" };

function plainName(what: string, file: unknown): string {
  const name = typeof file === "object" && file !== null ? (file as { path?: unknown }).path : undefined;
  if (typeof name !== "string" || !PLAIN.test(name)) {
    fail(`${what} ${JSON.stringify(name)}: a trial's file name may hold only letters, digits and -_.,:=+@% and not start with - (rename it)`);
  }
  return name;
}

/** The interpreter of a controller, from its extension as Rust's `Path::extension` reads it. */
function interpreter(name: string): string {
  const dot = name.lastIndexOf(".");
  const ext = dot > 0 ? name.slice(dot + 1) : "";
  const run = Object.hasOwn(INTERPRETERS, ext) ? INTERPRETERS[ext] : undefined;
  if (run === undefined) {
    fail(`controller ${JSON.stringify(name)}: name a .js file (run by node) or a .py file (run by python3)`);
  }
  return run;
}

function milliseconds(what: string, v: unknown): number | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
    fail(`${what} must be a whole number of milliseconds, not ${String(v)}`);
  }
  return v;
}

/**
 * The project of a trial: the controller and each scenario as files named by their `path`, one
 * `plimsoll-trial-runner` step naming the simulator, each scenario with its trajectory (its
 * name with `.json` replaced by `.bin`), and the trajectories as the artifacts, in the
 * scenarios' order. Throws (a `RequestShapeError`, which {@link Client.trial} turns into a
 * not-dispatched `request` refusal) what the runner could not take: a name with a character
 * its words cannot carry, two files of one name, a controller that is neither JavaScript nor
 * Python, no scenario.
 */
export function trialProject(spec: TrialSpec): Project {
  if (typeof spec.simulator !== "string" || !SIMULATOR.test(spec.simulator)) {
    fail(
      `simulator ${JSON.stringify(spec.simulator)}: a simulator name matches [a-z0-9][a-z0-9._-]{0,63} (providers().images lists each image's simulators)`,
    );
  }
  if (!Array.isArray(spec.scenarios) || spec.scenarios.length === 0) {
    fail("scenarios must be a non-empty list of files: a trial needs one");
  }
  const controller = plainName("controller", spec.controller);
  const run = interpreter(controller);
  const words = [TRIAL_RUNNER, "--simulator", spec.simulator];
  if (spec.simulator_sha256 !== undefined) {
    if (typeof spec.simulator_sha256 !== "string" || !/^[0-9a-f]{64}$/.test(spec.simulator_sha256)) {
      fail(`simulator_sha256 must be 64 lowercase hex digits, not ${JSON.stringify(spec.simulator_sha256)}`);
    }
    words.push("--simulator-sha256", spec.simulator_sha256);
  }
  const names = new Set([controller]);
  const trajectories: string[] = [];
  for (const file of spec.scenarios) {
    const name = plainName("scenario", file);
    if (names.has(name)) fail(`scenario ${JSON.stringify(name)}: another file of the trial is named ${name}; rename one`);
    names.add(name);
    const trajectory = `${name.endsWith(".json") ? name.slice(0, -".json".length) : name}.bin`;
    if (names.has(trajectory)) {
      fail(`scenario ${JSON.stringify(name)}: its trajectory ${trajectory} would overwrite another file of the trial; rename one`);
    }
    names.add(trajectory);
    trajectories.push(trajectory);
    words.push("--scenario", name, "--trajectory", trajectory);
  }
  for (const [flag, value] of [
    ["--first-deadline-ms", milliseconds("first_deadline_ms", spec.first_deadline_ms)],
    ["--tick-deadline-ms", milliseconds("tick_deadline_ms", spec.tick_deadline_ms)],
  ] as const) {
    if (value !== undefined) words.push(flag, String(value));
  }
  if (spec.reproducible !== undefined && typeof spec.reproducible !== "boolean") {
    fail(`reproducible must be a boolean, not ${String(spec.reproducible)}`);
  }
  if (spec.reproducible === true) words.push("--reproducible");
  words.push("--", run, controller);
  return {
    kind: "project",
    files: [spec.controller, ...spec.scenarios],
    steps: [{ run: words.join(" ") }],
    artifacts: trajectories,
  };
}
