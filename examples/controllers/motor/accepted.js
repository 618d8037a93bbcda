// examples/controllers/motor/accepted.js: a speed controller for the DC motor
// (sims/motor/motor.cpp, docs/simulators.md), the textbook cascade: an outer PI loop on the
// speed sets a current reference, limited to 4 A (the winding trips above 5 A) with
// anti-windup, and an inner loop turns it into a voltage: the resistive drop and the back-EMF
// at the reference, plus a proportional correction on the measured current. Passes every
// scenario in sims/motor/scenarios.
//
// Reads one state per line, `speed current target` (rad/s, A, rad/s), and answers one
// armature voltage per line, in volts, within [-12, 12].
//
// Run it through the trial runner:
//   plimsoll-trial-runner --sim motor.wasm --scenario standard.json ... -- node accepted.js
"use strict";

const readline = require("node:readline");

// The motor's constants (the simulator's description).
const R = 1.0; // ohm
const K = 0.05; // V s/rad = N m/A
const TICK = 0.01; // s, 100 ticks per second
const V_MAX = 12.0; // V
const I_MAX = 4.0; // A, the reference's bound, clear of the 5 A trip
// Gains.
const K_P = 0.16; // A per rad/s of speed error
const K_I = 1.6; // A per rad of integrated speed error
const K_C = 1.0; // V per A of current error

let integral = 0.0; // rad

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on("line", (line) => {
  const [speed, current, target] = line.split(" ").map(Number);
  const error = target - speed;
  let reference = K_P * error + K_I * integral;
  if (reference > I_MAX) {
    reference = I_MAX;
  } else if (reference < -I_MAX) {
    reference = -I_MAX;
  } else {
    integral = integral + error * TICK;
  }
  let voltage = R * reference + K * speed + K_C * (reference - current);
  if (voltage > V_MAX) {
    voltage = V_MAX;
  } else if (voltage < -V_MAX) {
    voltage = -V_MAX;
  }
  // String(number) is the shortest text that reads back as the same double.
  process.stdout.write(String(voltage) + "\n");
});
