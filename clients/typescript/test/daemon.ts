/**
 * A real plimsolld for the tests, as a child process: a loopback port, a fresh state
 * directory and callers file, a sandbox uid range picked from a port this process holds (the
 * same scheme as plimsoll_daemon::testing::uid_base_for_port, so no other suite's daemon meets
 * its uids), a clean environment; stopped with SIGTERM.
 * @module
 */

import { type ChildProcess, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, realpathSync } from "node:fs";
import { appendFile, chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { type Server, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { IMAGE, PLIMSOLLD, ROUTER, throughRouter } from "./paths.js";

/** How long plimsolld may take to listen, and then to probe its providers. */
const START_TIMEOUT_MS = 60_000;
/** How long it may take to stop after SIGTERM. */
const STOP_TIMEOUT_MS = 30_000;
/** The caller the tests run as. */
export const CALLER = "ts-test";

/** What the daemon offers. */
export interface DaemonPlan {
  providers: string[];
  /** The daemon's `[daemon].max_body_bytes`. */
  maxBodyBytes?: number;
  /** A grants file's text; the daemon starts with `--grants` pointing at it. */
  grants?: string;
  /** Variables added to the daemon's otherwise clean environment (a grant's secret). */
  env?: Record<string, string>;
  /** Further callers (each gets a token of its own: {@link LocalDaemon.tokenOf}). */
  otherCallers?: string[];
  /** Further settings sections, appended (`[pools]\n`, `[sessions]\n...`). */
  sections?: string;
  /**
   * The daemon's `max_concurrent` and `max_per_caller` (default 4 each): every open session
   * holds one of its uid slots.
   */
  maxConcurrent?: number;
}

/** What keeps these tests from starting a daemon, or `undefined` when nothing does. */
export function missingForDaemon(): string | undefined {
  if (process.getuid?.() !== 0) {
    return "running sandboxes needs root (the process tier switches to a sandbox uid)";
  }
  if (!existsSync(PLIMSOLLD)) {
    return `no plimsolld at ${PLIMSOLLD}: run \`make build\``;
  }
  return undefined;
}

/** What keeps the container tier from running, or `undefined`. */
export function missingForImage(): string | undefined {
  return existsSync(join(IMAGE, "identity")) ? undefined : `no sandbox image at ${IMAGE}: run \`make images\``;
}

function listenOnLoopback(server: Server): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const addr = server.address();
      if (addr === null || typeof addr === "string") {
        reject(new Error("no port"));
        return;
      }
      resolve(addr.port);
    });
  });
}

/** A TOML basic string (JSON's escapes are TOML's for these values). */
const toml = (s: string): string => JSON.stringify(s);

/** A running plimsolld child. */
export class LocalDaemon {
  /** Base URL, e.g. `http://127.0.0.1:40123` (the router's, with PLIMSOLL_TEST_ROUTER=1). */
  url = "";
  /** The daemon's own base URL. */
  nodeUrl = "";
  private router: ChildProcess | undefined;
  private log = "";
  private exited: Promise<void>;
  private stopping = false;

  private constructor(
    private readonly child: ChildProcess,
    /** A token of caller `ts-test`. */
    readonly token: string,
    private readonly uidPort: Server,
    private readonly dir: string,
    private readonly others: Map<string, string>,
  ) {
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (chunk: string) => {
      this.log += chunk;
    });
    this.exited = new Promise((resolve) => child.once("exit", () => resolve()));
    // A test process that dies must not leave the daemon behind.
    process.once("exit", () => {
      if (child.exitCode === null) child.kill("SIGKILL");
    });
  }

  /** The token of one of the plan's `otherCallers`. */
  tokenOf(caller: string): string {
    const t = this.others.get(caller);
    if (t === undefined) throw new Error(`no caller ${caller} in this daemon's plan`);
    return t;
  }

  /** Starts plimsolld and waits until every provider has been probed. */
  static async start(plan: DaemonPlan): Promise<LocalDaemon> {
    const dir = await mkdtemp(join(tmpdir(), "plimsoll-ts-client-"));
    // Sandbox uids must traverse it to reach their run directories under `state`.
    await chmod(dir, 0o711);
    const state = join(dir, "state");
    await mkdir(state);
    const newToken = (): string => `plm_${randomBytes(32).toString("base64url")}`;
    const token = newToken();
    const others = new Map((plan.otherCallers ?? []).map((name) => [name, newToken()] as const));
    const callers = join(dir, "callers.toml");
    const entry = (name: string, t: string): string =>
      `[[caller]]\nname = ${toml(name)}\ntoken_sha256 = ${toml(createHash("sha256").update(t).digest("hex"))}\n`;
    await writeFile(callers, [entry(CALLER, token), ...[...others].map(([n, t]) => entry(n, t))].join("\n"), { mode: 0o600 });
    const uidPort = createServer();
    const port = await listenOnLoopback(uidPort);
    uidPort.unref();
    const settings = [
      `providers = [${plan.providers.map(toml).join(", ")}]`,
      `default_floor = "container"`,
      `state_dir = ${toml(state)}`,
      `sandbox_uid_base = ${1_000_000_000 + port * 1024}`,
      `max_concurrent = ${plan.maxConcurrent ?? 4}`,
      `max_per_caller = ${plan.maxConcurrent ?? 4}`,
      "",
      "[oci]",
      // The daemon refuses an image reached through a symlink (build/ may be one).
      `image = ${toml(existsSync(IMAGE) ? realpathSync(IMAGE) : IMAGE)}`,
      "",
      "[daemon]",
      `callers_file = ${toml(callers)}`,
      ...(plan.maxBodyBytes !== undefined ? [`max_body_bytes = ${plan.maxBodyBytes}`] : []),
      "",
      plan.sections ?? "",
    ].join("\n");
    const config = join(dir, "plimsoll.toml");
    await writeFile(config, settings);
    const args = ["--config", config, "--listen", "127.0.0.1:0"];
    if (plan.grants !== undefined) {
      const grants = join(dir, "grants.toml");
      await writeFile(grants, plan.grants, { mode: 0o600 });
      args.push("--grants", grants);
    }
    const child = spawn(PLIMSOLLD, args, {
      cwd: dir,
      // A clean environment: nothing of this process's (NODE_EXTRA_CA_CERTS, proxies) leaks in.
      env: {
        PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        PLIMSOLL_LOG: "info",
        ...plan.env,
      },
      stdio: ["ignore", "ignore", "pipe"],
    });
    const d = new LocalDaemon(child, token, uidPort, dir, others);
    try {
      await d.waitReady();
      d.nodeUrl = d.url;
      if (throughRouter()) await d.startRouter(callers, entry);
    } catch (e) {
      await d.stop();
      throw e;
    }
    return d;
  }

  private async waitReady(): Promise<void> {
    const deadline = Date.now() + START_TIMEOUT_MS;
    while (this.url === "") {
      const line = this.log.split("\n").find((l) => l.includes('"listening"'));
      if (line !== undefined) {
        const addr = (JSON.parse(line) as { addr?: string }).addr;
        if (addr !== undefined) this.url = `http://${addr}`;
      }
      this.checkAlive(deadline, "start listening");
      await sleep(20);
    }
    for (;;) {
      try {
        const r = await fetch(`${this.url}/readyz`, { headers: { connection: "close" } });
        await r.arrayBuffer();
        if (r.status === 200) return;
      } catch {
        // Not serving yet.
      }
      if (this.log.includes("no provider passed its probe")) return;
      this.checkAlive(deadline, "probe its providers");
      await sleep(50);
    }
  }

  /**
   * Puts a plimsoll-router in front of the daemon (its own caller in the same callers file,
   * learning the daemon every 200 ms); `url` becomes the router's once it can place runs.
   */
  private async startRouter(callers: string, entry: (name: string, t: string) => string): Promise<void> {
    const token = `plm_${randomBytes(32).toString("base64url")}`;
    await appendFile(callers, `\n${entry("router", token)}`);
    const tokenFile = join(this.dir, "router.token");
    await writeFile(tokenFile, token, { mode: 0o600 });
    const node = this.nodeUrl.replace("http://", "");
    const args = ["--listen", "127.0.0.1:0", "--refresh-ms", "200", "--nodes", node];
    const router = spawn(ROUTER, [...args, "--callers", callers, "--token-file", tokenFile], {
      env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", PLIMSOLL_LOG: "info" },
      stdio: ["ignore", "ignore", "pipe"],
    });
    this.router = router;
    process.once("exit", () => {
      if (router.exitCode === null) router.kill("SIGKILL");
    });
    let log = "";
    router.stderr?.setEncoding("utf8");
    router.stderr?.on("data", (chunk: string) => {
      log += chunk;
    });
    const deadline = Date.now() + START_TIMEOUT_MS;
    let url = "";
    while (url === "") {
      const line = log.split("\n").find((l) => l.includes('"listening"'));
      const addr = line === undefined ? undefined : (JSON.parse(line) as { addr?: string }).addr;
      if (addr !== undefined) url = `http://${addr}`;
      if (router.exitCode !== null || Date.now() > deadline) throw new Error(`plimsoll-router did not start:\n${log}`);
      await sleep(20);
    }
    while (Date.now() < deadline) {
      const r = await fetch(`${url}/readyz`, { headers: { connection: "close" } });
      await r.arrayBuffer();
      if (r.status === 200) break;
      await sleep(50);
    }
    this.url = url;
  }

  private checkAlive(deadline: number, what: string): void {
    if (this.child.exitCode !== null || this.child.signalCode !== null) {
      throw new Error(`plimsolld exited (${this.child.exitCode ?? this.child.signalCode}) before it was ready:\n${this.tail()}`);
    }
    if (Date.now() > deadline) {
      throw new Error(`plimsolld did not ${what} within ${START_TIMEOUT_MS} ms:\n${this.tail()}`);
    }
  }

  /** The daemon's log so far (JSON lines). */
  logText(): string {
    return this.log;
  }

  /** The last lines of its log. */
  tail(n = 30): string {
    return this.log.trimEnd().split("\n").slice(-n).join("\n");
  }

  /** Stops it (SIGTERM, then SIGKILL) and removes its directory. */
  async stop(): Promise<void> {
    if (!this.stopping) {
      this.stopping = true;
      if (this.router !== undefined && this.router.exitCode === null && this.router.signalCode === null) {
        const exited = new Promise((resolve) => this.router!.once("exit", resolve));
        this.router.kill("SIGKILL");
        await exited;
      }
      if (this.child.exitCode === null && this.child.signalCode === null) {
        this.child.kill("SIGTERM");
        const timer = setTimeout(() => this.child.kill("SIGKILL"), STOP_TIMEOUT_MS);
        await this.exited;
        clearTimeout(timer);
      }
      this.uidPort.close();
      await rm(this.dir, { recursive: true, force: true });
    }
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
