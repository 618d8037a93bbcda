/**
 * A record's trial steps (record field 13) without a daemon: read strictly and digested as the
 * golden vectors say, a score by its IEEE 754 bits (`-0` is not `0`), nulls and an empty list
 * as absent.
 * @module
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { inspect } from "node:util";

import {
  Client,
  NotDispatchedError,
  type RunRecord,
  ShapeError,
  TRIAL_ENDS,
  decodeRunRecord,
  notDispatchedReason,
  recordSha256,
  trialProject,
} from "@plimsoll/client";

import { VECTORS } from "./paths.js";

const SIM = "d7156572f87f3c557127a511301424f5c8cc718a269bf4274b5e0258d5b6656e";

interface Vector {
  name: string;
  input: Record<string, unknown>;
  sha256: string;
}
const vectors = new Map(
  (JSON.parse(readFileSync(VECTORS, "utf8")) as { vectors: Vector[] }).vectors.map((v) => [v.name, v]),
);
function vector(name: string): Vector {
  const v = vectors.get(name);
  assert.ok(v !== undefined, `no vector ${name}`);
  return v;
}

/** record/trials with `trials` replaced by the JSON text given (numbers kept as written). */
function withTrials(trialsJson: string): string {
  const base = { ...vector("record/trials").input };
  delete base.trials;
  const json = JSON.stringify(base);
  return `${json.slice(0, -1)},"trials":${trialsJson}}`;
}

/** The trial step of record/trials as JSON text, with `edit` applied to its object. */
function stepJson(edit: (step: Record<string, unknown> & { trials: Record<string, unknown>[] }) => void): string {
  const trials = structuredClone(vector("record/trials").input.trials) as (Record<string, unknown> & {
    trials: Record<string, unknown>[];
  })[];
  edit(trials[0]!);
  return JSON.stringify(trials);
}

function digest(json: string): string {
  return recordSha256(decodeRunRecord(json));
}

test("the trial vectors are there and read", () => {
  for (const name of ["record/trials", "record/trials-nulls", "record/trials-two-steps", "record/null-trials"]) {
    vector(name);
  }
  const rec: RunRecord = decodeRunRecord(JSON.stringify(vector("record/trials").input));
  assert.equal(rec.trials.length, 1);
  const step = rec.trials[0]!;
  assert.deepEqual([step.step, step.pass, step.simulator], [1, false, { name: "cartpole", version: "1.0.0", sha256: SIM }]);
  const [ok, failed] = step.trials;
  assert.deepEqual(ok, {
    scenario: "standard",
    end: "completed",
    ticks: 2000,
    pass: true,
    fingerprint: "93585277088f4cfbd7683a2db52ab4a44906d74c74468ab9a49d4ddc8e959d41",
  });
  assert.equal(failed?.scenario, undefined);
  assert.deepEqual([failed?.end, failed?.reason, failed?.ticks, failed?.score, failed?.pass], [
    "failed",
    "the pole fell past 12 degrees",
    188,
    0.094,
    false,
  ]);
  assert.equal(recordSha256(rec), vector("record/trials").sha256);
  assert.deepEqual(decodeRunRecord(JSON.stringify(vector("record/null-trials").input)).trials, []);
  assert.deepEqual(TRIAL_ENDS.length, 6);
});

test("a score is digested by its bits: -0.0 is not 0, the integer 1 is 1.0", () => {
  // The vector's file text, not JSON.parse's: `-0.0` keeps its sign only as text.
  const text = readFileSync(VECTORS, "utf8");
  assert.ok(text.includes('"score": -0.0'), "record/trials-two-steps holds a score of -0.0");
  const two = vector("record/trials-two-steps");
  const scores = (two.input.trials as { trials: { score?: number }[] }[])[1]!.trials.map((t) => t.score);
  assert.deepEqual(scores, [1, -0]);
  const json = (negative: string): string =>
    withTrials(JSON.stringify(two.input.trials).replace('"score":0,', `"score":${negative},`));
  assert.equal(digest(json("-0.0")), two.sha256);
  assert.equal(digest(json("-0")), two.sha256);
  assert.notEqual(digest(json("0")), two.sha256);
  const rec = decodeRunRecord(json("-0.0"));
  assert.ok(Object.is(rec.trials[1]!.trials[1]!.score, -0));
  const one = (score: string): string =>
    digest(withTrials(stepJson((s) => (s.trials[1]!.score = 0)).replace('"score":0', `"score":${score}`)));
  assert.equal(one("1"), one("1.0"));
  assert.equal(one("1"), one("1e0"));
  assert.notEqual(one("1"), one("1.0000000000000002"));
});

test("every member of a trial step is covered, and an empty list is none", () => {
  const v = vector("record/trials");
  const image = vector("record/image").sha256;
  assert.equal(digest(withTrials("[]")), image);
  assert.equal(digest(withTrials("null")), image);
  const edits: [string, (s: Record<string, unknown> & { trials: Record<string, unknown>[] }) => void][] = [
    ["step", (s) => (s.step = 2)],
    ["pass", (s) => (s.pass = true)],
    ["simulator.name", (s) => ((s.simulator as Record<string, string>).name = "tank")],
    ["simulator.version", (s) => ((s.simulator as Record<string, string>).version = "1.0.1")],
    ["simulator.sha256", (s) => ((s.simulator as Record<string, string>).sha256 = "0".repeat(64))],
    ["scenario", (s) => (s.trials[0]!.scenario = "other")],
    ["end", (s) => (s.trials[0]!.end = "failed")],
    ["reason", (s) => (s.trials[0]!.reason = "why")],
    ["ticks", (s) => (s.trials[0]!.ticks = 1999)],
    ["score", (s) => (s.trials[1]!.score = 0.095)],
    ["trial pass", (s) => (s.trials[0]!.pass = false)],
    ["fingerprint", (s) => (s.trials[0]!.fingerprint = "0".repeat(64))],
    ["order", (s) => s.trials.reverse()],
  ];
  for (const [what, edit] of edits) {
    assert.notEqual(digest(withTrials(stepJson(edit))), v.sha256, what);
  }
});

test("a record's trials are read strictly", () => {
  const bad: [string, string][] = [
    ["an unknown member", stepJson((s) => (s.extra = 1))],
    ["no simulator", stepJson((s) => delete s.simulator)],
    ["trials null", stepJson((s) => ((s as Record<string, unknown>).trials = null))],
    ["a step below 0", stepJson((s) => (s.step = -1))],
    ["a step above u32", stepJson((s) => (s.step = 2 ** 32))],
    ["an unknown simulator member", stepJson((s) => ((s.simulator as Record<string, unknown>).abi = 1))],
    ["verdict/1's end", stepJson((s) => (s.trials[0]!.end = "fell"))],
    ["a verdict member", stepJson((s) => (s.trials[0]!.detail = "x"))],
    ["a score as a string", stepJson((s) => (s.trials[0]!.score = "1"))],
    ["a score as a boolean", stepJson((s) => (s.trials[0]!.score = true))],
    ["fractional ticks", stepJson((s) => (s.trials[0]!.ticks = 1.5))],
    ["a null trial", stepJson((s) => s.trials.push(null as unknown as Record<string, unknown>))],
    ["an object for the list", `{"0":${stepJson(() => undefined).slice(1, -1)}}`],
  ];
  for (const [what, trials] of bad) {
    assert.throws(() => decodeRunRecord(withTrials(trials)), ShapeError, what);
  }
  // JSON has no infinite number; one that overflows binary64 is refused, not read as Infinity.
  const huge = stepJson((s) => (s.trials[1]!.score = 0)).replace('"score":0', '"score":1e999');
  assert.throws(() => decodeRunRecord(withTrials(huge)), /not a finite binary64 number/);
});

// ---------------------------------------------------------------------------------------
// The trial helper: the request `plimsoll trial` builds.

test("a trial is one trial step with its scenarios and trajectories", () => {
  const controller = { path: "c.py", content: "print(0)\n" };
  const scenarios = [
    { path: "hidden-1.json", content: "{}" },
    { path: "h2.json", content: new Uint8Array([0x7b, 0x7d]) },
  ];
  const project = trialProject({ simulator: "tank", controller, scenarios, first_deadline_ms: 5000, reproducible: true });
  // The step crates/cli/src/trial.rs's test expects for the same trial, word for word.
  assert.deepEqual(project, {
    kind: "project",
    files: [controller, ...scenarios],
    steps: [
      {
        run:
          "plimsoll-trial-runner --simulator tank --scenario hidden-1.json --trajectory hidden-1.bin " +
          "--scenario h2.json --trajectory h2.bin --first-deadline-ms 5000 --reproducible -- python3 c.py",
      },
    ],
    artifacts: ["hidden-1.bin", "h2.bin"],
  });
  const every = trialProject({
    simulator: "motor",
    simulator_sha256: "0f".repeat(32),
    controller: { path: "ctl.js", content: "x" },
    scenarios: [{ path: "a,b:c=d+e@f%g_h-1.2", content: "{}" }],
    first_deadline_ms: 0,
    tick_deadline_ms: 250,
    reproducible: false,
  });
  assert.deepEqual(every.steps, [
    {
      run:
        `plimsoll-trial-runner --simulator motor --simulator-sha256 ${"0f".repeat(32)} ` +
        "--scenario a,b:c=d+e@f%g_h-1.2 --trajectory a,b:c=d+e@f%g_h-1.2.bin " +
        "--first-deadline-ms 0 --tick-deadline-ms 250 -- node ctl.js",
    },
  ]);
  for (const name of ["c.mjs", "c.cjs", "..js"]) {
    const p = trialProject({ simulator: "tank", controller: { path: name, content: "x" }, scenarios });
    assert.ok(p.steps[0]!.run.endsWith(` -- node ${name}`), name);
  }
});

test("what the runner could not take is refused here, unsent (not dispatched, request)", async () => {
  // No daemon listens there: a refusal that sent nothing is the only answer possible.
  const client = new Client({ url: "http://127.0.0.1:9", token: "plm_test" });
  const cases: [string[], string, RegExp][] = [
    [["a b.json"], "c.py", /may hold only/],
    [["--uid=0.json"], "c.py", /not start with -/],
    [["s.json"], "-c.py", /not start with -/],
    [["x/s.json"], "c.py", /may hold only/],
    [["s.json"], "c d.py", /may hold only/],
    [["s.json"], "", /may hold only/],
    [["s.json"], "é.py", /may hold only/],
    [["s.json", "s.json"], "c.py", /another file of the trial is named s\.json/],
    [["c.py"], "c.py", /another file of the trial is named c\.py/],
    [["s.bin.json", "s.bin"], "c.js", /would overwrite/],
    [["s.json"], "c.bin.json", /a \.js file/],
    [["s.json"], "c.rb", /a \.js file/],
    [["s.json"], ".py", /a \.js file/],
    [["s.json"], "py", /a \.js file/],
    [["s.json"], "c.constructor", /a \.js file/],
    [[], "c.py", /non-empty list/],
  ];
  for (const [names, controller, says] of cases) {
    const spec = {
      simulator: "tank",
      controller: { path: controller, content: "x" },
      scenarios: names.map((path) => ({ path, content: "{}" })),
    };
    assert.throws(() => trialProject(spec), says, controller);
    const e = await client.trial({ ...spec, minimum_isolation: "container" }).then(
      () => assert.fail("resolved"),
      (err: unknown) => err,
    );
    assert.ok(e instanceof NotDispatchedError, inspect(e));
    assert.equal(e.reason, "request");
    assert.equal(e.source, "client");
    assert.equal(notDispatchedReason(e), "request");
    assert.match(e.message, says);
    assert.match(e.message, /nothing was sent/);
  }
  const base = { simulator: "tank", controller: { path: "c.py", content: "x" }, scenarios: [{ path: "s.json", content: "{}" }] };
  for (const [edit, says] of [
    [{ simulator: "Tank" }, /\[a-z0-9\]/],
    [{ simulator: "" }, /\[a-z0-9\]/],
    [{ simulator: "t".repeat(65) }, /\[a-z0-9\]/],
    [{ simulator: "tank --sim x" }, /\[a-z0-9\]/],
    [{ simulator_sha256: "xyz" }, /64 lowercase hex/],
    [{ simulator_sha256: "A".repeat(64) }, /64 lowercase hex/],
    [{ first_deadline_ms: -1 }, /whole number of milliseconds/],
    [{ tick_deadline_ms: 1.5 }, /whole number of milliseconds/],
    [{ first_deadline_ms: 2 ** 53 }, /whole number of milliseconds/],
  ] as const) {
    assert.throws(() => trialProject({ ...base, ...edit }), says, inspect(edit));
  }
  // A setting the run does not have is refused too, unsent.
  const e = await client.trial({ ...base, ...({ simulatr: "boat" } as object) }).catch((err: unknown) => err);
  assert.ok(e instanceof NotDispatchedError && e.source === "client", inspect(e));
  assert.match(e.message, /unknown member `simulatr`/);
});
