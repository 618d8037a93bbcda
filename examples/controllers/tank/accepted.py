"""examples/controllers/tank/accepted.py: the tank level controller of accepted.js, in Python.

Feed-forward of the measured outflow plus a PI correction on the level error, with anti-windup
(the integral stops while the valve is saturated). Same gains and the same order of operations
as the JavaScript one, so on the same scenario it answers the same valve openings to the last
bit (both print the shortest text that reads back as the same double).

Reads one state per line, `level setpoint inflow outflow` (m, m, m3/s, m3/s), and answers one
valve opening per line, a fraction in [0, 1].

Run it through the trial runner:
  plimsoll-trial-runner --sim tank.wasm --scenario standard.json ... -- python3 accepted.py
"""

import sys

MAX_INFLOW = 0.02  # m3/s through the valve fully open (the simulator's description)
TICK = 0.1  # s, 10 ticks per second
K_P = 5.0  # valve per metre of error
K_I = 0.1  # valve per metre-second of error


def main():
    integral = 0.0  # metre-seconds
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        level, setpoint, _inflow, outflow = (float(v) for v in line.split())
        error = setpoint - level
        valve = outflow / MAX_INFLOW + K_P * error + K_I * integral
        if valve < 0.0:
            valve = 0.0
        elif valve > 1.0:
            valve = 1.0
        else:
            integral = integral + error * TICK
        # repr(float) is the shortest text that reads back as the same double.
        sys.stdout.write(repr(valve) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
