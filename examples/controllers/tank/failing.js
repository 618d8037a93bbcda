// examples/controllers/tank/failing.js: a first draft of accepted.js with the error taken the
// wrong way round (level - setpoint), and no integral. Below the set point it closes the valve
// and the tank runs dry; above it, it opens the valve and the tank overflows: every scenario
// in sims/tank/scenarios ends "failed" within a few minutes of simulated time.
"use strict";

const readline = require("node:readline");

const MAX_INFLOW = 0.02; // m3/s
const K_P = 5.0; // valve per metre of error

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on("line", (line) => {
  const [level, setpoint, , outflow] = line.split(" ").map(Number);
  const error = level - setpoint; // wrong sign: should be setpoint - level
  const valve = outflow / MAX_INFLOW + K_P * error;
  process.stdout.write(String(valve) + "\n");
});
