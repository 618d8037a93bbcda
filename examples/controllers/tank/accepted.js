// examples/controllers/tank/accepted.js: a level controller for the water tank
// (sims/tank/tank.c, docs/simulators.md): feed-forward of the measured outflow plus a PI
// correction on the level error, with anti-windup (the integral stops while the valve is
// saturated). Passes every scenario in sims/tank/scenarios.
//
// Reads one state per line, `level setpoint inflow outflow` (m, m, m3/s, m3/s), and answers
// one valve opening per line, a fraction in [0, 1].
//
// Run it through the trial runner:
//   plimsoll-trial-runner --sim tank.wasm --scenario standard.json ... -- node accepted.js
"use strict";

const readline = require("node:readline");

const MAX_INFLOW = 0.02; // m3/s through the valve fully open (the simulator's description)
const TICK = 0.1; // s, 10 ticks per second
const K_P = 5.0; // valve per metre of error
const K_I = 0.1; // valve per metre-second of error

let integral = 0.0; // metre-seconds

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on("line", (line) => {
  const [level, setpoint, , outflow] = line.split(" ").map(Number);
  const error = setpoint - level;
  let valve = outflow / MAX_INFLOW + K_P * error + K_I * integral;
  if (valve < 0.0) {
    valve = 0.0;
  } else if (valve > 1.0) {
    valve = 1.0;
  } else {
    integral = integral + error * TICK;
  }
  // String(number) is the shortest text that reads back as the same double.
  process.stdout.write(String(valve) + "\n");
});
