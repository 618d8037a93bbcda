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
  decodeRunResponse,
  decodeRunResult,
  DigestMismatchError,
  type EgressReceipt,
  encodeRecord,
  encodeRequest,
  encodeResult,
  evidenceSha256,
  notDispatchedReason,
  recordSha256,
  requestSha256,
  ShapeError,
  sha256Hex,
  verifyResponse,
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
  assert.deepEqual(read("record/restored-first-call-nulls"), read("record/restored-first-call"));
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

// ---------------------------------------------------------------------------------------
// Egress receipts: a result that carries them verifies against the digest the vector gives
// (not one computed here), and any change to a receipt no longer does.

const egressRequest = decodeRunRequest(
  JSON.stringify({ protocol: 1, request_id: "r-egress", run: { kind: "snippet", language: "python", code: "print(1)" } }),
);

/** A 200 answer's text carrying `result` and claiming `resultSha256` for it; the request's and record's digests honest. */
function egressAnswer(result: unknown, resultSha256: string): string {
  const record: Record<string, unknown> = {
    request_id: egressRequest.request_id,
    request_sha256: requestSha256(egressRequest),
    result_sha256: resultSha256,
    provider: "crun",
    isolation: "container",
    minimum_isolation: "container",
    evidence_sha256: "e".repeat(64),
    environment: `sha256:${"1".repeat(64)}`,
    started_unix_ms: 1,
    ended_unix_ms: 2,
  };
  record.record_sha256 = recordSha256(decodeRunRecord(JSON.stringify({ ...record, record_sha256: "" })));
  return JSON.stringify({
    protocol: 1,
    request_id: egressRequest.request_id,
    provider: "crun",
    isolation: "container",
    duration_ms: 700,
    request_sha256: record.request_sha256,
    result_sha256: resultSha256,
    result,
    record,
  });
}

const containerFloor = { tier: "container", source: "request" } as const;

for (const name of ["result/egress-receipts", "result/egress-receipts-nulls"]) {
  test(`a result with egress receipts verifies against ${name}'s digest`, () => {
    const v = byName.get(name);
    assert.ok(v !== undefined, `no vector ${name}`);
    const r = verifyResponse(egressRequest, decodeRunResponse(egressAnswer(v.input, v.sha256)), containerFloor);
    assert.equal(r.result_sha256, v.sha256);
    const egress = r.result.egress;
    assert.deepEqual(
      egress.map((g) => [g.kind, g.verdict]),
      [
        ["connect", "allowed"],
        ["http", "allowed"],
        ["http", "refused"],
        ["connect", "refused"],
      ],
    );
    const connect: EgressReceipt = {
      host: "api.example.com",
      port: 443,
      kind: "connect",
      address: "93.184.215.14:443",
      sni: "api.example.com",
      bytes_up: 517,
      bytes_down: 4821,
      start_ms: 112,
      end_ms: 348,
      verdict: "allowed",
      rule: "host *.example.com port 443",
      ended: "closed",
    };
    assert.deepEqual(egress[0], connect);
    assert.equal(egress[1]!.sni, undefined);
    assert.ok(egress[1]!.rule.endsWith(" via 10.0.0.0/8"));
    // Absent and null alike leave the member out.
    assert.deepEqual(Object.keys(egress[2]!).filter((k) => ["address", "sni", "ended"].includes(k)), []);
    assert.equal(egress[3]!.port, 0);
  });
}

test("a changed egress receipt fails the vector's digest", () => {
  const v = byName.get("result/egress-receipts");
  assert.ok(v !== undefined);
  type Receipts = Record<string, unknown>[];
  const changes: [string, (g: Receipts) => void][] = [
    ["a start time", (g) => (g[0]!.start_ms = (g[0]!.start_ms as number) + 1)],
    ["an end time", (g) => (g[0]!.end_ms = (g[0]!.end_ms as number) + 1)],
    ["the address", (g) => (g[0]!.address = "93.184.215.15:443")],
    ["the SNI dropped", (g) => delete g[0]!.sni],
    ["a verdict", (g) => (g[2]!.verdict = "allowed")],
    ["a port", (g) => (g[3]!.port = 1)],
    ["the order", (g) => g.reverse()],
    ["one dropped", (g) => g.pop()],
  ];
  for (const [what, change] of changes) {
    const input = structuredClone(v.input) as { egress: Receipts };
    change(input.egress);
    assert.throws(
      () => verifyResponse(egressRequest, decodeRunResponse(egressAnswer(input, v.sha256)), containerFloor),
      (e) => e instanceof DigestMismatchError && e.digest === "result" && e.claimed === v.sha256 && notDispatchedReason(e) === undefined,
      what,
    );
  }
});

test("egress receipts are read strictly, and none is the digest of old", () => {
  const plain = byName.get("result/plain");
  assert.ok(plain !== undefined);
  for (const empty of [[], null]) {
    const r = decodeRunResult(JSON.stringify({ ...(plain.input as object), egress: empty }));
    assert.deepEqual(r.egress, []);
    assert.equal(sha256Hex(encodeResult(r)), plain.sha256);
  }
  const v = byName.get("result/egress-receipts");
  assert.ok(v !== undefined);
  for (const [bad, says] of [
    [{ extra: 1 }, /unknown member `extra`/],
    [{ port: 65536 }, /out of range for u16/],
    [{ port: null }, /port: missing/],
    [{ rule: 7 }, /rule: expected a string/],
    [{ start_ms: -1 }, /out of range for u64/],
  ] as const) {
    const input = structuredClone(v.input) as { egress: Record<string, unknown>[] };
    Object.assign(input.egress[0]!, bad);
    assert.throws(() => decodeRunResult(JSON.stringify(input)), (e) => e instanceof ShapeError && says.test(e.message));
  }
});
