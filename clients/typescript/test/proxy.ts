/**
 * A real HTTP proxy on loopback in front of a real plimsolld, which rewrites what passes
 * through it or swaps two answers: the parties in the middle the client must catch.
 * @module
 */

import { type IncomingMessage, type Server, createServer, request as httpRequest } from "node:http";

/** Rewrites a parsed JSON body in place, or returns what to send instead. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Rewrite = (body: any) => unknown;

/** Which requests a proxy alters (by default, runs: `POST /v1/runs`). */
export type Match = (method: string, url: string) => boolean;

/** What the proxy does. */
export type Mode =
  | {
      kind: "rewrite";
      request?: Rewrite;
      response?: Rewrite;
      /** The requests to alter (default: runs). */
      match?: Match;
      /** Sent instead of the caller's `Authorization` on the requests altered. */
      authorization?: string;
    }
  /** Holds the answers of two requests until both are in, then gives each the other's. */
  | { kind: "swap" }
  /** Forwards a run, then resets the client's connection instead of answering. */
  | { kind: "reset" }
  /** Forwards a run, then answers this instead. */
  | { kind: "replace"; status: number; body: string; headers?: Record<string, string> }
  /**
   * Forwards what `match` names, then writes its answer back in pieces of `piece` bytes, an
   * empty line (a keep-alive) after each newline: lines split across reads.
   */
  | { kind: "dribble"; match: Match; piece: number };

interface Answer {
  status: number;
  body: Buffer;
  contentType?: string | undefined;
}

function readAll(stream: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => resolve(Buffer.concat(chunks)));
    stream.on("error", reject);
  });
}

function rewrite(body: Buffer, f: Rewrite | undefined): Buffer {
  if (f === undefined || body.length === 0) return body;
  const v: unknown = JSON.parse(body.toString("utf8"));
  const instead = f(v);
  return Buffer.from(JSON.stringify(instead === undefined ? v : instead), "utf8");
}

/**
 * Sends a request on to the daemon, passing the caller's authorization (or `authorization`)
 * and the headers a session call carries through.
 */
function forward(upstream: URL, req: IncomingMessage, body: Buffer, authorization?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string | number> = { connection: "close", "content-length": body.length };
    const auth = authorization ?? req.headers.authorization;
    if (auth !== undefined) headers.authorization = auth;
    for (const name of ["content-type", "accept", "plimsoll-request-id"]) {
      const v = req.headers[name];
      if (typeof v === "string") headers[name] = v;
    }
    const up = httpRequest(
      { host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers, agent: false },
      (res) => {
        readAll(res).then((b) => resolve({ status: res.statusCode ?? 502, body: b, contentType: res.headers["content-type"] }), reject);
      },
    );
    up.on("error", reject);
    up.end(body);
  });
}

/** A proxy serving on a loopback port. */
export class Proxy {
  /** Requests it has received. */
  received = 0;
  private readonly held = new Map<number, Answer>();
  private waiting: (() => void)[] = [];

  private constructor(
    private readonly server: Server,
    /** Its base URL. */
    readonly url: string,
  ) {}

  static async start(upstream: string, mode: Mode): Promise<Proxy> {
    const target = new URL(upstream);
    let proxy: Proxy | undefined;
    const server = createServer((req, res) => {
      const n = proxy!.received++;
      void (async () => {
        try {
          // Only runs (or what `match` names) are altered: the client's other calls (its
          // default floor) pass through.
          const match: Match =
            (mode.kind === "rewrite" || mode.kind === "dribble" ? mode.match : undefined) ?? ((_, url) => url === "/v1/runs");
          const runs = match(req.method ?? "", req.url ?? "");
          let body = await readAll(req);
          if (mode.kind === "rewrite" && runs) body = rewrite(body, mode.request);
          let answer = await forward(target, req, body, mode.kind === "rewrite" && runs ? mode.authorization : undefined);
          let headers: Record<string, string> = { "content-type": answer.contentType ?? "application/json" };
          if (runs) {
            switch (mode.kind) {
              case "rewrite":
                answer = { status: answer.status, body: rewrite(answer.body, mode.response), contentType: answer.contentType };
                break;
              case "swap":
                answer = await proxy!.swap(n, answer);
                break;
              case "reset":
                req.socket.resetAndDestroy();
                return;
              case "replace":
                answer = { status: mode.status, body: Buffer.from(mode.body) };
                headers = { "content-type": "text/html", ...mode.headers };
                break;
              case "dribble": {
                const body = Buffer.from(answer.body.toString("latin1").replaceAll("\n", "\n\n"), "latin1");
                res.writeHead(answer.status, { ...headers, connection: "close" });
                for (let at = 0; at < body.length; at += mode.piece) {
                  res.write(body.subarray(at, at + mode.piece));
                  await new Promise((resolve) => setImmediate(resolve));
                }
                res.end();
                return;
              }
            }
          }
          res.writeHead(answer.status, { ...headers, "content-length": answer.body.length, connection: "close" });
          res.end(answer.body);
        } catch (e) {
          res.writeHead(599, { connection: "close" });
          res.end(`proxy failed: ${String(e)}`);
        }
      })();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const addr = server.address();
    if (addr === null || typeof addr === "string") throw new Error("proxy: no port");
    proxy = new Proxy(server, `http://127.0.0.1:${addr.port}`);
    return proxy;
  }

  /** Waits for the other request's answer and returns it. */
  private async swap(n: number, mine: Answer): Promise<Answer> {
    this.held.set(n, mine);
    this.waiting.forEach((wake) => wake());
    this.waiting = [];
    while (![...this.held.keys()].some((k) => k !== n)) {
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    }
    const other = [...this.held.keys()].find((k) => k !== n);
    if (other === undefined) throw new Error("proxy: no other answer");
    const answer = this.held.get(other)!;
    // Leave ours for the other side; it takes it the same way.
    return answer;
  }

  /** Stops it, closing every connection. */
  async close(): Promise<void> {
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }
}
