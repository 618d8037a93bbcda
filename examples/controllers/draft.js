// examples/controllers/draft.js: the accepted controller with the signs of the two cart gains
// flipped (K_X and K_X_DOT). It balances the pole for a while, but the cart runs away and
// the trial ends "fell" (|x| > 2.4 m or |theta| > 12 degrees) long before 2,000 ticks.
"use strict";

const readline = require("node:readline");

const K_X = -1.0; // wrong sign
const K_X_DOT = -2.0; // wrong sign
const K_THETA = 25.0;
const K_THETA_DOT = 5.0;

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on("line", (line) => {
  const [x, xDot, theta, thetaDot] = line.split(" ").map(Number);
  const force = K_X * x + K_X_DOT * xDot + K_THETA * theta + K_THETA_DOT * thetaDot;
  process.stdout.write(String(force) + "\n");
});
