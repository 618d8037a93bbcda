// examples/controllers/accepted.js: a PD-style cart-pole controller (docs/trials.md).
// Reads one state per line, `x x_dot theta theta_dot`, and answers one force per line, in
// newtons (positive pushes the cart towards +x). Keeps the pole up for the whole standard
// scenario (sims/cartpole/scenarios/standard.json).
//
// Run it through the trial runner:
//   plimsoll-trial-runner --scenario standard.json ... -- node accepted.js
"use strict";

const readline = require("node:readline");

// force = K_X * x + K_X_DOT * x_dot + K_THETA * theta + K_THETA_DOT * theta_dot
const K_X = 1.0;
const K_X_DOT = 2.0;
const K_THETA = 25.0;
const K_THETA_DOT = 5.0;

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on("line", (line) => {
  const [x, xDot, theta, thetaDot] = line.split(" ").map(Number);
  const force = K_X * x + K_X_DOT * xDot + K_THETA * theta + K_THETA_DOT * thetaDot;
  // String(number) is the shortest text that reads back as the same double.
  process.stdout.write(String(force) + "\n");
});
