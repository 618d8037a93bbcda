/**
 * A record's trial steps (record field 13) without a daemon: read strictly and digested as the
 * golden vectors say, a score by its IEEE 754 bits (`-0` is not `0`), nulls and an empty list
 * as absent.
 * @module
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { type RunRecord, ShapeError, TRIAL_ENDS, decodeRunRecord, recordSha256 } from "@plimsoll/client";

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
