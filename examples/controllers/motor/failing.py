"""examples/controllers/motor/failing.py: the draft of failing.js, in Python.

Bang-bang at full voltage: +12 V below the target, -12 V above it. It ignores the winding
current (6 A from standstill, far more when reversing at speed), so every scenario in
sims/motor/scenarios ends "failed" (the winding current exceeded 5 A) within its first ticks.
It answers the same numbers as failing.js.
"""

import sys

V_MAX = 12.0  # V


def main():
    for line in sys.stdin:
        speed, _current, target = (float(v) for v in line.split())
        voltage = V_MAX if speed < target else -V_MAX
        print(repr(voltage), flush=True)


if __name__ == "__main__":
    main()
