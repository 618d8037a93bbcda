/**
 * An agent tool that wraps a run: the function an agent framework calls with the model's
 * arguments, returning the output plus the tier it ran at, and saying plainly whether the code
 * ran, did not run, or may have run (a run that may have happened is never retried here).
 *
 *     PLIMSOLL_URL=http://127.0.0.1:7878 PLIMSOLL_TOKEN=plm_... node agent-tool.js python 'print(6 * 7)'
 * @module
 */

import { pathToFileURL } from "node:url";

import { Client, type Language, MayHaveRunError, type Tier, notDispatchedReason, text } from "@plimsoll/client";

/** What the model sends. */
export interface RunCodeArgs {
  language: Language;
  code: string;
}

/** What the tool hands back to the model. */
export interface RunCodeResult {
  /** `yes`: it ran and every check passed; `no`: nothing ran; `maybe`: it may have run. */
  ran: "yes" | "no" | "maybe";
  /** Standard output as text (invalid UTF-8 shown as U+FFFD). */
  output: string;
  /** Standard error as text. */
  stderr: string;
  exit_code: number | null;
  timed_out: boolean;
  /** The isolation tier the code actually ran at (only when it ran). */
  tier?: Tier;
  /** The provider that ran it. */
  provider?: string;
  /** What went wrong, for the model to read. */
  error?: string;
}

/** A tool definition in the shape agent frameworks take: a name, a JSON schema, a function. */
export function runCodeTool(client: Client, options: { minimumIsolation?: Tier; timeoutMs?: number } = {}) {
  const floor = options.minimumIsolation ?? "container";
  return {
    name: "run_code",
    description: `Runs a JavaScript or Python snippet in a sandbox at the ${floor} tier or stronger and returns its output and the tier it ran at.`,
    parameters: {
      type: "object",
      properties: {
        language: { type: "string", enum: ["javascript", "python"] },
        code: { type: "string", description: "the program to run" },
      },
      required: ["language", "code"],
      additionalProperties: false,
    },
    async call(args: RunCodeArgs): Promise<RunCodeResult> {
      const empty = { output: "", stderr: "", exit_code: null, timed_out: false };
      try {
        const res = await client.runSnippet(args.language, args.code, {
          minimum_isolation: floor,
          limits: { timeout_ms: options.timeoutMs ?? 10_000 },
        });
        const r = res.result;
        return {
          ran: "yes",
          output: text(r.stdout) + (r.stdout_truncated ? "\n[output truncated]" : ""),
          stderr: text(r.stderr),
          exit_code: r.exit_code,
          timed_out: r.timed_out,
          tier: res.isolation,
          provider: res.provider,
        };
      } catch (e) {
        const reason = notDispatchedReason(e);
        if (reason !== undefined) {
          return { ...empty, ran: "no", error: `nothing ran (${reason}): ${(e as Error).message}` };
        }
        if (e instanceof MayHaveRunError) {
          return { ...empty, ran: "maybe", error: `${e.message} (do not run it again without checking)` };
        }
        throw e;
      }
    },
  };
}

async function main(argv: string[]): Promise<number> {
  const [language, code] = argv;
  const url = process.env.PLIMSOLL_URL ?? "http://127.0.0.1:7878";
  const token = process.env.PLIMSOLL_TOKEN;
  if ((language !== "javascript" && language !== "python") || code === undefined || token === undefined) {
    console.error("usage: PLIMSOLL_TOKEN=plm_... [PLIMSOLL_URL=...] agent-tool javascript|python CODE [FLOOR]");
    return 2;
  }
  const tool = runCodeTool(new Client({ url, token }), { minimumIsolation: (argv[2] as Tier | undefined) ?? "container" });
  const result = await tool.call({ language, code });
  console.log(JSON.stringify(result));
  return result.ran === "yes" ? 0 : 1;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  process.exitCode = await main(process.argv.slice(2));
}
