"""examples/controllers/motor/accepted.py: the DC motor speed controller of accepted.js, in Python.

The textbook cascade: an outer PI loop on the speed sets a current reference, limited to 4 A
(the winding trips above 5 A) with anti-windup, and an inner loop turns it into a voltage: the
resistive drop and the back-EMF at the reference, plus a proportional correction on the
measured current. Same constants and the same order of operations as the JavaScript one, so on
the same scenario it answers the same voltages to the last bit.

Reads one state per line, `speed current target` (rad/s, A, rad/s), and answers one armature
voltage per line, in volts, within [-12, 12].

Run it through the trial runner:
  plimsoll-trial-runner --sim motor.wasm --scenario standard.json ... -- python3 accepted.py
"""

import sys

# The motor's constants (the simulator's description).
R = 1.0  # ohm
K = 0.05  # V s/rad = N m/A
TICK = 0.01  # s, 100 ticks per second
V_MAX = 12.0  # V
I_MAX = 4.0  # A, the reference's bound, clear of the 5 A trip
# Gains.
K_P = 0.16  # A per rad/s of speed error
K_I = 1.6  # A per rad of integrated speed error
K_C = 1.0  # V per A of current error


def main():
    integral = 0.0  # rad
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        speed, current, target = (float(v) for v in line.split())
        error = target - speed
        reference = K_P * error + K_I * integral
        if reference > I_MAX:
            reference = I_MAX
        elif reference < -I_MAX:
            reference = -I_MAX
        else:
            integral = integral + error * TICK
        voltage = R * reference + K * speed + K_C * (reference - current)
        if voltage > V_MAX:
            voltage = V_MAX
        elif voltage < -V_MAX:
            voltage = -V_MAX
        # repr(float) is the shortest text that reads back as the same double.
        sys.stdout.write(repr(voltage) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
