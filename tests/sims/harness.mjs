// tests/sims/harness.mjs: a stand-in for the trial runner's loop over a plimsoll-sim/1 simulator
// (docs/simulators.md), to try a simulator, its scenarios and controllers without the runner:
// no uids, no deadlines, no fuel, but the same numbers. It checks the metadata and scenarios
// much as the runner does, runs the controller as a child process over the line protocol of
// docs/trials.md (states written as Rust's `{}` writes them), and prints one JSON line per
// scenario: how it ended, the simulator's reason, the score, the state's range and the
// fingerprint, the SHA-256 of the trajectory (per tick, the state values sent then the actions
// as answered, before the clamp, little-endian binary64). The runner is the reference; this is
// a tool for exam authors and for tuning the example controllers.
//
// Usage: node tests/sims/harness.mjs SIM.wasm SCENARIO.json [SCENARIO.json ...] -- CMD [ARGS...]
//   e.g. scripts/build-sim sims/tank /tmp/tank.wasm && node tests/sims/harness.mjs \
//          /tmp/tank.wasm sims/tank/scenarios/*.json -- python3 examples/controllers/tank/accepted.py
// Exit status: 0 every trial passed, 1 a trial failed, 2 the simulator or a scenario was refused.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { createInterface } from "node:readline";

function refuse(what) {
  process.stderr.write(`harness: ${what}\n`);
  process.exit(2);
}

// Rust's `{}` for f64: the shortest decimal that reads back as the same double, never with an
// exponent, `-0` for negative zero.
function rustDisplay(x) {
  if (Object.is(x, -0)) return "-0";
  const s = String(x);
  const e = s.indexOf("e");
  if (e < 0) return s;
  const sign = s[0] === "-" ? "-" : "";
  const mantissa = s.slice(sign.length, e);
  const exp = Number(s.slice(e + 1));
  const [int, frac = ""] = mantissa.split(".");
  const digits = int + frac;
  const point = int.length + exp; // digits before the decimal point
  if (point <= 0) return `${sign}0.${"0".repeat(-point)}${digits}`;
  if (point >= digits.length) return sign + digits + "0".repeat(point - digits.length);
  return `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
}

function checkVariables(list, what, min, max, bounded) {
  if (!Array.isArray(list) || list.length < min || list.length > max) {
    refuse(`metadata: ${what} must hold ${min} to ${max} variables`);
  }
  const seen = new Set();
  for (const v of list) {
    const keys = bounded ? ["name", "unit", "min", "max"] : ["name", "unit"];
    for (const k of Object.keys(v)) if (!keys.includes(k)) refuse(`metadata: ${what}: unknown field ${k}`);
    if (typeof v.name !== "string" || !/^[A-Za-z_][A-Za-z0-9_]{0,31}$/.test(v.name)) {
      refuse(`metadata: ${what}: bad name ${JSON.stringify(v.name)}`);
    }
    if (seen.has(v.name)) refuse(`metadata: ${what}: ${v.name} twice`);
    seen.add(v.name);
    if (typeof v.unit !== "string" || !/^[\x20-\x7e]{0,16}$/.test(v.unit)) {
      refuse(`metadata: ${what}: ${v.name}: bad unit`);
    }
    if (bounded && !(Number.isFinite(v.min) && Number.isFinite(v.max) && v.min < v.max)) {
      refuse(`metadata: ${what}: ${v.name}: needs finite min < max`);
    }
  }
}

function cString(memory, address, limit) {
  const bytes = new Uint8Array(memory.buffer);
  let end = address;
  while (end < bytes.length && end - address < limit && bytes[end] !== 0) end++;
  return new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(address, end));
}

async function load(path) {
  const bytes = readFileSync(path);
  const module = await WebAssembly.compile(bytes);
  if (WebAssembly.Module.imports(module).length > 0) refuse(`${path} imports something`);
  const exports = new Set(WebAssembly.Module.exports(module).map((e) => e.name));
  for (const e of ["memory", "plimsoll_sim_abi", "metadata", "buffer", "init", "step", "state", "reason"]) {
    if (!exports.has(e)) refuse(`${path} lacks the export ${e}`);
  }
  const fresh = async () => (await WebAssembly.instantiate(module, {})).exports;
  const sim = await fresh();
  if (sim.plimsoll_sim_abi() !== 1) refuse(`${path} answers ABI ${sim.plimsoll_sim_abi()}`);
  const text = cString(sim.memory, sim.metadata(), 16384 + 1);
  if (Buffer.byteLength(text) > 16384) refuse("metadata longer than 16 KiB");
  const meta = JSON.parse(text);
  const fields = ["abi", "name", "version", "description", "ticks_per_second", "state", "action", "initial", "score"];
  for (const k of Object.keys(meta)) if (!fields.includes(k)) refuse(`metadata: unknown field ${k}`);
  if (meta.abi !== 1) refuse("metadata: abi is not 1");
  if (!/^[a-z0-9][a-z0-9._-]{0,63}$/.test(meta.name)) refuse("metadata: bad name");
  if (!/^[\x20-\x7e]{1,32}$/.test(meta.version)) refuse("metadata: bad version");
  if (meta.description !== undefined && Buffer.byteLength(meta.description) > 500) refuse("metadata: description too long");
  if (!Number.isInteger(meta.ticks_per_second) || meta.ticks_per_second < 1 || meta.ticks_per_second > 1e6) {
    refuse("metadata: bad ticks_per_second");
  }
  checkVariables(meta.state, "state", 1, 64, false);
  checkVariables(meta.action, "action", 1, 16, true);
  checkVariables(meta.initial, "initial", 0, 64, false);
  if (meta.score !== undefined) checkVariables([meta.score], "score", 1, 1, false);
  if (exports.has("score") !== (meta.score !== undefined)) refuse("score export and metadata disagree");
  return { bytes, meta, fresh };
}

// The controller: a process and the lines it has written, one promise per line.
function startController(argv) {
  const child = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  const queue = [];
  const waiting = [];
  let closed = false;
  createInterface({ input: child.stdout, terminal: false })
    .on("line", (line) => (waiting.length ? waiting.shift()(line) : queue.push(line)))
    .on("close", () => {
      closed = true;
      while (waiting.length) waiting.shift()(null);
    });
  child.stdin.on("error", () => {});
  return {
    ask(line) {
      child.stdin.write(line);
      if (queue.length) return Promise.resolve(queue.shift());
      if (closed) return Promise.resolve(null);
      return new Promise((resolve) => waiting.push(resolve));
    },
    end() {
      child.kill("SIGKILL");
      child.stdin.destroy();
    },
  };
}

async function trial(sim, scenarioPath, argv) {
  const { meta } = sim;
  const scenario = JSON.parse(readFileSync(scenarioPath, "utf8"));
  for (const k of Object.keys(scenario)) {
    if (!["name", "initial", "ticks", "pass_ticks", "min_score"].includes(k)) refuse(`${scenarioPath}: unknown field ${k}`);
  }
  const names = meta.initial.map((v) => v.name);
  const given = Object.keys(scenario.initial);
  if (given.length !== names.length || !names.every((n) => Number.isFinite(scenario.initial[n]))) {
    refuse(`${scenarioPath}: initial must be exactly ${names.join(", ")}, finite`);
  }
  if (!(scenario.ticks >= 1 && scenario.pass_ticks >= 1 && scenario.pass_ticks <= scenario.ticks)) {
    refuse(`${scenarioPath}: bad ticks or pass_ticks`);
  }
  if (scenario.min_score !== undefined && meta.score === undefined) refuse(`${scenarioPath}: min_score without a score`);

  const x = await sim.fresh();
  const n = meta.state.length;
  const m = meta.action.length;
  const buffer = () => new Float64Array(x.memory.buffer, x.buffer(), Math.max(names.length, m));
  buffer().set(names.map((k) => scenario.initial[k]));
  if (x.init() !== 0) refuse(`${scenarioPath}: init refused: ${cString(x.memory, x.reason(), 200)}`);

  const controller = startController(argv);
  const hash = createHash("sha256");
  const low = new Array(n).fill(Infinity);
  const high = new Array(n).fill(-Infinity);
  const readState = () => {
    const s = [];
    for (let i = 0; i < n; i++) {
      const v = x.state(i);
      if (!Number.isFinite(v)) throw new Error(`broken simulator: state ${meta.state[i].name} = ${v}`);
      s.push(v);
      low[i] = Math.min(low[i], v);
      high[i] = Math.max(high[i], v);
    }
    return s;
  };
  let end = "completed";
  let reason = null;
  let ticks = 0;
  let failedAt = null;
  let fault = null;
  for (let k = 0; k < scenario.ticks; k++) {
    const s = readState();
    const answer = await controller.ask(s.map(rustDisplay).join(" ") + "\n");
    if (answer === null) {
      fault = `controller_exited at tick ${k}`;
      break;
    }
    const words = answer.trim().split(/[ \t]+/);
    const action = words.map(Number);
    if (words.length !== m || !action.every(Number.isFinite)) {
      fault = `controller_garbage at tick ${k}: ${JSON.stringify(answer)}`;
      break;
    }
    const record = new Float64Array(n + m);
    record.set(s);
    record.set(action, n);
    hash.update(new Uint8Array(record.buffer));
    ticks++;
    buffer().set(action.map((a, i) => Math.min(Math.max(a, meta.action[i].min), meta.action[i].max)));
    const r = x.step();
    if (r === 0) continue;
    if (r !== 1 && r !== 2) throw new Error(`broken simulator: step returned ${r}`);
    reason = cString(x.memory, x.reason(), 200);
    if (r === 1) {
      end = "failed";
      failedAt = k + 1;
    }
    break;
  }
  controller.end();
  const finalState = readState();
  const score = meta.score !== undefined ? x.score() : null;
  if (score !== null && !Number.isFinite(score)) throw new Error(`broken simulator: score ${score}`);
  const pass =
    fault === null &&
    (end === "completed" ? true : failedAt > scenario.pass_ticks) &&
    (scenario.min_score === undefined || score >= scenario.min_score);
  return {
    scenario: basename(scenarioPath),
    end: fault ?? end,
    reason,
    ticks,
    failed_at_tick: failedAt,
    score,
    min_score: scenario.min_score ?? null,
    pass,
    fingerprint: hash.digest("hex"),
    final_state: Object.fromEntries(meta.state.map((v, i) => [v.name, finalState[i]])),
    range: Object.fromEntries(meta.state.map((v, i) => [v.name, [low[i], high[i]]])),
  };
}

const dash = process.argv.indexOf("--");
if (dash < 4 || dash === process.argv.length - 1) {
  process.stderr.write("usage: node harness.mjs SIM.wasm SCENARIO.json [...] -- CMD [ARGS...]\n");
  process.exit(2);
}
const sim = await load(process.argv[2]);
let all = true;
for (const scenario of process.argv.slice(3, dash)) {
  const verdict = await trial(sim, scenario, process.argv.slice(dash + 1));
  all &&= verdict.pass;
  process.stdout.write(JSON.stringify(verdict) + "\n");
}
process.exit(all ? 0 : 1);
