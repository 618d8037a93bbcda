"""examples/controllers/tank/failing.py: the draft of failing.js, in Python.

The error is taken the wrong way round (level - setpoint), and there is no integral. Below the
set point it closes the valve and the tank runs dry; above it, it opens the valve and the tank
overflows: every scenario in sims/tank/scenarios ends "failed". It answers the same numbers as
failing.js.
"""

import sys

MAX_INFLOW = 0.02  # m3/s
K_P = 5.0  # valve per metre of error


def main():
    for line in sys.stdin:
        level, setpoint, _inflow, outflow = (float(v) for v in line.split())
        error = level - setpoint  # wrong sign: should be setpoint - level
        valve = outflow / MAX_INFLOW + K_P * error
        print(repr(valve), flush=True)


if __name__ == "__main__":
    main()
