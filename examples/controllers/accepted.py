"""examples/controllers/accepted.py: the PD-style cart-pole controller of accepted.js, in Python.

Reads one state per line, `x x_dot theta theta_dot`, and answers one force per line, in newtons
(positive pushes the cart towards +x). Same gains and the same order of operations as the
JavaScript one, so on the same scenario it produces the same forces to the last bit (both
languages use IEEE doubles and print the shortest text that reads back exactly).

Run it through the trial runner:
  plimsoll-trial-runner --scenario standard.json ... -- python3 accepted.py
"""

import sys

K_X = 1.0
K_X_DOT = 2.0
K_THETA = 25.0
K_THETA_DOT = 5.0


def main():
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        x, x_dot, theta, theta_dot = (float(v) for v in line.split())
        force = K_X * x + K_X_DOT * x_dot + K_THETA * theta + K_THETA_DOT * theta_dot
        # repr(float) is the shortest text that reads back as the same double.
        sys.stdout.write(repr(force) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
