/**
 * Images without a daemon: a request's `image` (field 7) and a record's (field 12) read and
 * digested as the golden vectors say, a selector checked before anything is sent, the
 * providers listing's `images`, and the re-check that a run, a session and each of its calls
 * ran in the image named. The answers are synthetic, from a small HTTP server on loopback
 * (not a daemon), and every digest in them is right: only the image check can fail them.
 * @module
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { type IncomingMessage, type Server, type ServerResponse, createServer } from "node:http";
import { after, before, test } from "node:test";
import { inspect } from "node:util";

import {
  Client,
  DigestMismatchError,
  type Floor,
  type ImageRef,
  ImageMismatchError,
  MayHaveRunError,
  NotDispatchedError,
  type RunRecord,
  SessionLookupError,
  type SimulatorEntry,
  type RunRequest,
  type RunResponse,
  type RunResult,
  decodeProvidersResponse,
  decodeRunRecord,
  decodeRunRequest,
  decodeRunResult,
  decodeSessionInfo,
  imageAnswers,
  isImageIdentity,
  isImageName,
  notDispatchedReason,
  recordSha256,
  requestSha256,
  resultSha256,
  verifyResponse,
} from "@plimsoll/client";

import { VECTORS } from "./paths.js";

const IDENTITY = `sha256:${"5f".repeat(32)}`;
const OTHER_IDENTITY = `sha256:${"6a".repeat(32)}`;
const PYTHON_DATA: ImageRef = { name: "python-data", identity: IDENTITY };
const SANDBOX: ImageRef = { name: "sandbox", identity: OTHER_IDENTITY };
const CARTPOLE: SimulatorEntry = { name: "cartpole", path: "/opt/plimsoll/simulators/cartpole.wasm", sha256: "c".repeat(64) };
const TANK: SimulatorEntry = { name: "tank", path: "/opt/plimsoll/simulators/tank.wasm", sha256: "7a".repeat(32) };
const SID = `ses_${"0123456789abcdef"}_${"ab".repeat(16)}`;

interface Vector {
  name: string;
  kind: string;
  input: unknown;
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

// ---------------------------------------------------------------------------------------
// The wire.

test("the image vectors are there, and a record's image is read and covered", () => {
  for (const name of [
    "request/image-by-name",
    "request/image-by-identity",
    "request/every-optional-field-and-image",
    "record/image",
    "record/session-call-image",
  ]) {
    vector(name);
  }
  const json = JSON.stringify(vector("record/image").input);
  const rec = decodeRunRecord(json);
  assert.deepEqual(rec.image, PYTHON_DATA);
  assert.equal(recordSha256(rec), vector("record/image").sha256);
  const call = decodeRunRecord(JSON.stringify(vector("record/session-call-image").input));
  assert.deepEqual([call.session?.sequence, call.image], [1, PYTHON_DATA]);
  // Absent and null are one: without it the record has the digest it always had.
  const base = vector("record/image").input as Record<string, unknown>;
  const { image: _, ...plain } = base;
  const withNull = decodeRunRecord(JSON.stringify({ ...base, image: null }));
  assert.equal("image" in withNull, false);
  assert.equal(recordSha256(withNull), recordSha256(decodeRunRecord(JSON.stringify(plain))));
  assert.notEqual(recordSha256(withNull), vector("record/image").sha256);
  for (const changed of [{ ...PYTHON_DATA, name: "sandbox" }, { ...PYTHON_DATA, identity: OTHER_IDENTITY }]) {
    assert.notEqual(recordSha256({ ...rec, image: changed }), recordSha256(rec));
  }
  for (const [bad, says] of [
    [{ name: "python-data" }, /identity: missing/],
    [{ ...PYTHON_DATA, tag: "latest" }, /unknown member `tag`/],
    ["python-data", /expected an object/],
  ] as const) {
    assert.throws(() => decodeRunRecord(JSON.stringify({ ...base, image: bad })), says);
  }
});

test("a request's image is read back and digested as field 7", () => {
  for (const name of ["request/image-by-name", "request/image-by-identity", "request/every-optional-field-and-image"]) {
    const v = vector(name);
    const r = decodeRunRequest(JSON.stringify(v.input));
    assert.equal(r.image, (v.input as { image: string }).image);
    assert.equal(requestSha256(r), v.sha256, name);
    const { image: _, ...without } = r;
    assert.notEqual(requestSha256(without), v.sha256);
    assert.equal(requestSha256(decodeRunRequest(JSON.stringify({ ...(v.input as object), image: null }))), requestSha256(without));
  }
});

test("image names and identities are told apart", () => {
  for (const good of ["sandbox", "python-data", "a", "0.1_x-y", "x".repeat(64)]) assert.ok(isImageName(good), good);
  for (const bad of ["", "Sandbox", "-x", ".x", "a b", "a/b", "a:b", "x".repeat(65), IDENTITY]) assert.ok(!isImageName(bad), bad);
  assert.ok(isImageIdentity(IDENTITY));
  for (const bad of ["sha256:", `sha256:${"0A".repeat(32)}`, `sha512:${"0a".repeat(32)}`, `sha256:${"0a".repeat(33)}`]) {
    assert.ok(!isImageIdentity(bad), bad);
  }
  assert.ok(imageAnswers(PYTHON_DATA, "python-data") && imageAnswers(PYTHON_DATA, IDENTITY) && !imageAnswers(PYTHON_DATA, "sandbox"));
});

test("a providers listing reads its images: absent or null is none, unknown members refused", () => {
  const listing = {
    protocol: 1,
    default_floor: "container",
    providers: [],
    images: [
      { ...SANDBOX, default: true, languages: ["python", "javascript"], vm_disk: true, simulators: [CARTPOLE, TANK] },
      { ...PYTHON_DATA, default: false, languages: ["python"] },
    ],
  };
  const p = decodeProvidersResponse(JSON.stringify(listing));
  assert.deepEqual(p.images, [
    { ...SANDBOX, default: true, languages: ["python", "javascript"], vm_disk: true, simulators: [CARTPOLE, TANK] },
    { ...PYTHON_DATA, default: false, languages: ["python"], vm_disk: false, simulators: [] },
  ]);
  // The simulators an image declares: absent, null or empty is none.
  for (const simulators of [undefined, null, []]) {
    const images = [{ ...PYTHON_DATA, default: true, simulators }];
    assert.deepEqual(decodeProvidersResponse(JSON.stringify({ ...listing, images })).images[0]?.simulators, []);
  }
  assert.equal(p.images.find((i) => imageAnswers(i, IDENTITY))?.name, "python-data");
  assert.equal(p.images.find((i) => i.default)?.name, "sandbox");
  for (const images of [undefined, null, []]) {
    assert.deepEqual(decodeProvidersResponse(JSON.stringify({ ...listing, images })).images, []);
  }
  for (const [bad, says] of [
    [{ ...SANDBOX, default: true, languages: ["ruby"] }, /not a language/],
    [{ ...SANDBOX, default: true, size: 1 }, /unknown member `size`/],
    [SANDBOX, /default: missing/],
    [{ ...SANDBOX, default: true, simulators: [{ ...TANK, abi: 1 }] }, /unknown member `abi`/],
    [{ ...SANDBOX, default: true, simulators: [{ ...TANK, sha256: "A".repeat(64) }] }, /sha256: expected 64 lowercase hex digits/],
    [{ ...SANDBOX, default: true, simulators: [{ ...TANK, sha256: "a".repeat(63) }] }, /sha256: expected 64 lowercase hex digits/],
    [{ ...SANDBOX, default: true, simulators: [{ name: "tank", sha256: TANK.sha256 }] }, /simulators\[0\]\.path: missing/],
    [{ ...SANDBOX, default: true, simulators: [{ ...TANK, name: 1 }] }, /name: expected a string/],
    [{ ...SANDBOX, default: true, simulators: [null] }, /expected an object/],
    [{ ...SANDBOX, default: true, simulators: { tank: TANK } }, /expected a list/],
  ] as const) {
    assert.throws(() => decodeProvidersResponse(JSON.stringify({ ...listing, images: [bad] })), says);
  }
});

test("a session's image is read", () => {
  const info = {
    protocol: 1,
    session_id: SID,
    language: "python",
    provider: "crun",
    isolation: "container",
    minimum_isolation: "container",
    evidence_sha256: "e".repeat(64),
    environment: IDENTITY,
    wall: { uid: 1, euid: 1, gid: 1, root_read_only: true },
    opened_unix_ms: 1,
    expires_unix_ms: 2,
    idle_timeout_ms: 300000,
    calls: 0,
    interpreter_alive: true,
  };
  assert.deepEqual(decodeSessionInfo(JSON.stringify({ ...info, image: PYTHON_DATA })).image, PYTHON_DATA);
  assert.equal("image" in decodeSessionInfo(JSON.stringify({ ...info, image: null })), false);
  assert.throws(() => decodeSessionInfo(JSON.stringify({ ...info, image: { name: "x" } })), /identity: missing/);
});

// ---------------------------------------------------------------------------------------
// A run's image re-check (verifyResponse, as the client calls it).

const plainResult = { exit_code: 0, timed_out: false, stdout: "1\n", stdout_truncated: false, stderr: "", stderr_truncated: false };

function request(image?: string): RunRequest {
  const r: RunRequest = {
    protocol: 1,
    request_id: "r-1",
    minimum_isolation: "container",
    run: { kind: "snippet", language: "python", code: "print(1)" },
  };
  if (image !== undefined) r.image = image;
  return r;
}

/** An honest answer to `req`, its record naming `image` (`undefined`: none), every digest right. */
function honest(req: RunRequest, image: ImageRef | undefined): RunResponse {
  const result: RunResult = decodeRunResult(JSON.stringify(plainResult));
  const record: RunRecord = {
    request_id: req.request_id,
    request_sha256: requestSha256(req),
    result_sha256: resultSha256(result),
    provider: "crun",
    isolation: "container",
    minimum_isolation: "container",
    evidence_sha256: "e".repeat(64),
    environment: image?.identity ?? "test",
    started_unix_ms: 1,
    ended_unix_ms: 2,
    ...(image === undefined ? {} : { image }),
    trials: [],
    record_sha256: "",
  };
  record.record_sha256 = recordSha256(record);
  return {
    protocol: 1,
    request_id: req.request_id,
    provider: "crun",
    isolation: "container",
    duration_ms: 1,
    request_sha256: record.request_sha256,
    result_sha256: record.result_sha256,
    result,
    record,
  };
}

const floor: Floor = { tier: "container", source: "request" };

function isImageMismatch(e: unknown, asked: string, image: ImageRef | undefined): boolean {
  return (
    e instanceof ImageMismatchError &&
    e instanceof MayHaveRunError &&
    e.kind === "image_mismatch" &&
    e.code === "evidence_mismatch" &&
    e.asked === asked &&
    JSON.stringify(e.image) === JSON.stringify(image) &&
    notDispatchedReason(e) === undefined &&
    /the code ran/.test(e.message)
  );
}

for (const asked of ["python-data", IDENTITY]) {
  test(`a run that names ${asked === IDENTITY ? "an identity" : "a name"} verifies in that image only`, () => {
    const req = request(asked);
    assert.deepEqual(verifyResponse(req, honest(req, PYTHON_DATA), floor).record.image, PYTHON_DATA);
    assert.throws(() => verifyResponse(req, honest(req, SANDBOX), floor), (e) => isImageMismatch(e, asked, SANDBOX) && /ran in image `sandbox`/.test(String(e)));
    assert.throws(() => verifyResponse(req, honest(req, undefined), floor), (e) => isImageMismatch(e, asked, undefined) && /names no image/.test(String(e)));
  });
}

test("a run that names no image takes whichever ran; the image comes before the digests", () => {
  const req = request();
  for (const image of [PYTHON_DATA, SANDBOX, undefined]) verifyResponse(req, honest(req, image), floor);
  // The record's image changed, its digest left stale: a digest mismatch when none was
  // named, an image mismatch when one was (checked first, as the tier is).
  const stale = honest(req, PYTHON_DATA);
  stale.record.image = SANDBOX;
  assert.throws(() => verifyResponse(req, stale, floor), DigestMismatchError);
  const named = request("python-data");
  const swapped = honest(named, PYTHON_DATA);
  swapped.record.image = SANDBOX;
  assert.throws(() => verifyResponse(named, swapped, floor), ImageMismatchError);
});

// ---------------------------------------------------------------------------------------
// Through the client, against a synthetic server on loopback.

/** What the synthetic server answers with, set by each test. */
const serve = {
  /** The image the run's record, the session and its calls' records name (`undefined`: none). */
  run: undefined as ImageRef | undefined,
  open: undefined as ImageRef | undefined,
  call: undefined as ImageRef | undefined,
  /** The image a later `GET` of the session shows. */
  shown: undefined as ImageRef | undefined,
  /** Requests seen: method and path, and the JSON body if any. */
  seen: [] as { method: string; path: string; body: unknown }[],
};

let server: Server;
let url = "";

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}

function sessionInfo(requestId: string | undefined, image: ImageRef | undefined, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    protocol: 1,
    ...(requestId === undefined ? {} : { request_id: requestId }),
    session_id: SID,
    language: "python",
    provider: "crun",
    isolation: "container",
    minimum_isolation: "container",
    evidence_sha256: "e".repeat(64),
    environment: IDENTITY,
    ...(image === undefined ? {} : { image }),
    wall: { uid: 1, euid: 1, gid: 1, root_read_only: true },
    opened_unix_ms: 1,
    expires_unix_ms: 2,
    idle_timeout_ms: 300000,
    calls: 0,
    interpreter_alive: true,
    ...extra,
  };
}

/** An honest answer to the request `body` (its JSON as sent), at `link` in a session if given. */
function answer(body: string, image: ImageRef | undefined, link?: { session_id: string; sequence: number }): Record<string, unknown> {
  const req = decodeRunRequest(body);
  const result = link === undefined ? plainResult : { ...plainResult, state_kept: true };
  const record: Record<string, unknown> = {
    request_id: req.request_id,
    request_sha256: requestSha256(req),
    result_sha256: resultSha256(decodeRunResult(JSON.stringify(result))),
    provider: "crun",
    isolation: "container",
    minimum_isolation: "container",
    evidence_sha256: "e".repeat(64),
    environment: IDENTITY,
    started_unix_ms: 1,
    ended_unix_ms: 2,
    ...(link === undefined ? {} : { session: link }),
    ...(image === undefined ? {} : { image }),
  };
  record.record_sha256 = recordSha256(decodeRunRecord(JSON.stringify({ ...record, record_sha256: "0".repeat(64) })));
  return {
    protocol: 1,
    request_id: req.request_id,
    provider: "crun",
    isolation: "container",
    duration_ms: 1,
    request_sha256: record.request_sha256,
    result_sha256: record.result_sha256,
    result,
    record,
  };
}

async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
  const body = await readBody(req);
  const path = req.url ?? "";
  serve.seen.push({ method: req.method ?? "", path, body: body === "" ? undefined : JSON.parse(body) });
  const send = (v: unknown): void => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(v));
  };
  if (req.method === "GET" && path === "/v1/providers") {
    send({ protocol: 1, default_floor: "container", providers: [], images: [{ ...PYTHON_DATA, default: true, languages: ["python"] }] });
  } else if (req.method === "POST" && path === "/v1/runs") {
    send(answer(body, serve.run));
  } else if (req.method === "POST" && path === "/v1/sessions") {
    send(sessionInfo((JSON.parse(body) as { request_id: string }).request_id, serve.open));
  } else if (req.method === "POST" && path === `/v1/sessions/${SID}/cells`) {
    send(answer(body, serve.call, { session_id: SID, sequence: 1 }));
  } else if (req.method === "GET" && path === `/v1/sessions/${SID}`) {
    send(sessionInfo(undefined, serve.shown));
  } else if (req.method === "DELETE" && path === `/v1/sessions/${SID}`) {
    send(sessionInfo(String(req.headers["plimsoll-request-id"]), serve.open, { end_reason: "closed", interpreter_alive: false }));
  } else {
    res.writeHead(404).end();
  }
}

before(async () => {
  server = createServer((req, res) => {
    handle(req, res).catch((e: unknown) => {
      res.writeHead(500).end(String(e));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const addr = server.address();
  assert.ok(addr !== null && typeof addr !== "string");
  url = `http://127.0.0.1:${addr.port}`;
});

after(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

const client = (): Client => new Client({ url, token: "t" });

test("a selector that names no image is refused here, nothing sent", async () => {
  const before = serve.seen.length;
  for (const bad of ["", "Sandbox", "a:b", "x".repeat(65), `sha256:${"0A".repeat(32)}`]) {
    for (const attempt of [
      client().runPython("print(1)", { minimum_isolation: "container", image: bad }),
      client().openSession({ language: "python", minimum_isolation: "container", image: bad }),
    ]) {
      const e = await (attempt as Promise<unknown>).then(
        (v) => assert.fail(`sent: ${inspect(v)}`),
        (x: unknown) => x,
      );
      assert.ok(e instanceof NotDispatchedError && e.reason === "request" && /neither an image name/.test(e.message), inspect(e));
    }
  }
  assert.equal(serve.seen.length, before, "the client sent something");
});

test("a run names its image, and its record must name it", async () => {
  serve.run = PYTHON_DATA;
  const res = await client().runPython("print(1)", { minimum_isolation: "container", image: "python-data" });
  assert.deepEqual(res.record.image, PYTHON_DATA);
  assert.equal((serve.seen.at(-1)?.body as { image?: string }).image, "python-data");
  await client().runPython("print(1)", { minimum_isolation: "container", image: IDENTITY });
  await client().runProject({ steps: [{ run: "true" }] }, { minimum_isolation: "container", image: "python-data" });
  for (const other of [SANDBOX, undefined]) {
    serve.run = other;
    const e = await client()
      .runPython("print(1)", { minimum_isolation: "container", image: "python-data" })
      .then(() => undefined, (x: unknown) => x);
    assert.ok(isImageMismatch(e, "python-data", other), inspect(e));
  }
  // Named by none, the request carries none and takes whichever ran.
  const none = await client().runPython("print(1)", { minimum_isolation: "container" });
  assert.equal(none.record.image, undefined);
  assert.equal("image" in (serve.seen.at(-1)?.body as object), false);
});

test("a session opens in the image named, else it is closed again; each call's record must name it", async () => {
  serve.open = PYTHON_DATA;
  serve.call = PYTHON_DATA;
  const s = await client().openSession({ language: "python", minimum_isolation: "container", image: "python-data" });
  assert.equal((serve.seen.at(-1)?.body as { image?: string }).image, "python-data");
  assert.deepEqual(s.info.image, PYTHON_DATA);
  assert.deepEqual((await s.cell("print(1)")).record.image, PYTHON_DATA);
  // What the daemon shows later must be the image of the open.
  serve.shown = PYTHON_DATA;
  assert.deepEqual((await s.refresh()).image, PYTHON_DATA);
  for (const other of [SANDBOX, undefined]) {
    serve.shown = other;
    const e = await s.refresh().then(() => undefined, (x: unknown) => x);
    assert.ok(e instanceof SessionLookupError && e.kind === "bad_response" && /image/.test(e.message), inspect(e));
  }

  // A call whose record names another image, or none: the code ran; an evidence mismatch.
  for (const other of [SANDBOX, undefined]) {
    serve.call = other;
    const opened = await client().openSession({ language: "python", minimum_isolation: "container", image: IDENTITY });
    const e = await opened.cell("print(1)").then(() => undefined, (x: unknown) => x);
    assert.ok(isImageMismatch(e, IDENTITY, other) && /the session call/.test(String(e)), inspect(e));
  }

  // An open answered in another image, or none: refused, and that session closed again.
  for (const other of [SANDBOX, undefined]) {
    serve.open = other;
    const seen = serve.seen.length;
    const e = await client()
      .openSession({ language: "python", minimum_isolation: "container", image: "python-data" })
      .then(() => undefined, (x: unknown) => x);
    assert.ok(isImageMismatch(e, "python-data", other) && /the session /.test(String(e)), inspect(e));
    assert.ok(e instanceof MayHaveRunError && e.closeError === undefined);
    assert.deepEqual(
      serve.seen.slice(seen).map((r) => r.method),
      ["POST", "DELETE"],
    );
  }

  // Named by none, the session and its calls take whichever image.
  serve.open = SANDBOX;
  serve.call = undefined;
  const any = await client().openSession({ language: "python", minimum_isolation: "container" });
  assert.equal("image" in (serve.seen.at(-1)?.body as object), false);
  await any.cell("print(1)");
});
