// examples/controllers/motor/failing.js: a first draft of a speed controller, bang-bang at full
// voltage: +12 V below the target, -12 V above it. The fastest way to the target on paper, but
// it ignores the winding current: from standstill the motor would draw 6 A, and reversing at
// speed far more, so every scenario in sims/motor/scenarios ends "failed" (the winding current
// exceeded 5 A) within its first ticks.
"use strict";

const readline = require("node:readline");

const V_MAX = 12.0; // V

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on("line", (line) => {
  const [speed, , target] = line.split(" ").map(Number);
  const voltage = speed < target ? V_MAX : -V_MAX;
  process.stdout.write(String(voltage) + "\n");
});
