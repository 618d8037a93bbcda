/**
 * Where the tests find the repository's files: the compiled tests live in
 * clients/typescript/build/test, so the repository is four directories up.
 * @module
 */

import { fileURLToPath } from "node:url";
import { dirname, resolve } from "node:path";

/** clients/typescript. */
export const CLIENT_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
/** The repository root. */
export const REPO = resolve(CLIENT_DIR, "..", "..");
/** The golden vectors every client checks. */
export const VECTORS = resolve(REPO, "crates/wire/tests/golden/vectors.json");
/** The daemon binary `make build` makes. */
export const PLIMSOLLD = resolve(REPO, "target/debug/plimsolld");
/** The router `make build` makes (docs/cluster.md). */
export const ROUTER = resolve(REPO, "target/debug/plimsoll-router");
/** The sandbox image `make images` makes. */
export const IMAGE = resolve(REPO, "build/images/sandbox");

/** True when tests run strictly (CI): every skip is then a failure. */
export function strict(): boolean {
  const ci = process.env.CI;
  return ci === "true" || ci === "1";
}

/**
 * PLIMSOLL_TEST_ROUTER=1: every daemon is reached through a plimsoll-router in front of it, so
 * the whole suite checks that the router passes answers on untouched.
 */
export function throughRouter(): boolean {
  return process.env.PLIMSOLL_TEST_ROUTER === "1";
}
