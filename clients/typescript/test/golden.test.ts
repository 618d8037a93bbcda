/**
 * Every golden vector of crates/wire/tests/golden/vectors.json (read from the repository at
 * test time, so a changed vector is picked up), through this client's reader and encoder.
 * @module
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  canonicalJson,
  decodeEvidence,
  decodeRunRecord,
  decodeRunRequest,
  decodeRunResult,
  encodeRecord,
  encodeRequest,
  encodeResult,
  evidenceSha256,
  sha256Hex,
} from "@plimsoll/client";

import { VECTORS } from "./paths.js";

interface Vector {
  name: string;
  kind: "request" | "result" | "record" | "evidence";
  input: unknown;
  encoding_hex: string;
  sha256: string;
  canonical_json?: string;
  same_digest_as?: string | null;
}

const vectors: Vector[] = (JSON.parse(readFileSync(VECTORS, "utf8")) as { vectors: Vector[] }).vectors;
const byName = new Map(vectors.map((v) => [v.name, v]));

const NEGATIVE_ZERO = "__plimsoll_golden_negative_zero__";

/**
 * A vector's input as JSON text again. `JSON.parse` reads the vectors' `-0.0` (a trial's score)
 * as `-0`, which `JSON.stringify` writes as `0`: write it back with its sign, as the file has it.
 */
function vectorJson(value: unknown): string {
  const json = JSON.stringify(value, (_key, v: unknown) => (typeof v === "number" && Object.is(v, -0) ? NEGATIVE_ZERO : v));
  return json.replaceAll(`"${NEGATIVE_ZERO}"`, "-0.0");
}

/** The encoding of a vector's input, read from its JSON as a receiver would. */
function encode(v: Vector): Uint8Array {
  const json = vectorJson(v.input);
  switch (v.kind) {
    case "request":
      return encodeRequest(decodeRunRequest(json));
    case "result":
      return encodeResult(decodeRunResult(json));
    case "record":
      return encodeRecord(decodeRunRecord(json));
    case "evidence":
      return new TextEncoder().encode(canonicalJson(decodeEvidence(json)));
  }
}

test("the vectors file holds every kind", () => {
  const kinds = new Set(vectors.map((v) => v.kind));
  assert.deepEqual([...kinds].sort(), ["evidence", "record", "request", "result"]);
  assert.ok(vectors.length >= 17, `only ${vectors.length} vectors`);
});

for (const v of vectors) {
  test(`golden vector ${v.name}`, () => {
    const bytes = encode(v);
    assert.equal(Buffer.from(bytes).toString("hex"), v.encoding_hex, "encoding");
    assert.equal(sha256Hex(bytes), v.sha256, "sha256");
    if (v.kind === "evidence") {
      const evidence = decodeEvidence(JSON.stringify(v.input));
      assert.equal(canonicalJson(evidence), v.canonical_json, "canonical JSON");
      assert.equal(evidenceSha256(evidence), v.sha256);
    }
    if (v.same_digest_as !== undefined && v.same_digest_as !== null) {
      const other = byName.get(v.same_digest_as);
      assert.ok(other !== undefined, `no vector ${v.same_digest_as}`);
      assert.equal(v.sha256, other.sha256);
      assert.equal(sha256Hex(encode(other)), sha256Hex(bytes));
    }
  });
}

test("nulls at every depth read as absent, and a member with a default takes it", () => {
  // Read whole, not only encoded: the vector and its twin without nulls are the same value.
  const read = (name: string): unknown => {
    const v = byName.get(name);
    assert.ok(v !== undefined, `no vector ${name}`);
    const json = vectorJson(v.input);
    return v.kind === "result" ? decodeRunResult(json) : v.kind === "record" ? decodeRunRecord(json) : decodeRunRequest(json);
  };
  assert.deepEqual(read("result/nested-nulls"), read("result/defaults"));
  assert.deepEqual(read("record/null-floor"), read("record/plain"));
  assert.deepEqual(read("record/trials-nulls"), read("record/trials"));
  assert.deepEqual(read("record/null-trials"), read("record/image"));
  const nulls = read("request/project-nested-nulls") as { request_id: string };
  const defaults = read("request/project-defaults") as { request_id: string };
  assert.deepEqual({ ...nulls, request_id: "" }, { ...defaults, request_id: "" });
  assert.deepEqual(read("request/null-limit-member"), { ...(read("request/empty-limits-object") as object), request_id: "r-6" });
});

test("a request's id is not in its digest", () => {
  for (const v of vectors.filter((x) => x.kind === "request")) {
    const input = { ...(v.input as Record<string, unknown>), request_id: "another-id" };
    const bytes = encodeRequest(decodeRunRequest(JSON.stringify(input)));
    assert.equal(sha256Hex(bytes), v.sha256, v.name);
  }
});

test("a step's duration is not in the result digest, its output is", () => {
  const v = vectors.find((x) => x.kind === "result" && ((x.input as { steps?: unknown[] }).steps ?? []).length > 0);
  assert.ok(v !== undefined, "a result vector with steps");
  const input = structuredClone(v.input) as { steps: { duration_ms: number; stdout: unknown }[] };
  input.steps[0]!.duration_ms += 1000;
  assert.equal(sha256Hex(encodeResult(decodeRunResult(JSON.stringify(input)))), v.sha256);
  input.steps[0]!.stdout = "something else";
  assert.notEqual(sha256Hex(encodeResult(decodeRunResult(JSON.stringify(input)))), v.sha256);
});
