/*
 * sims/cartpole/cartpole.c: the cart-pole of Barto, Sutton & Anderson (1983) as a WebAssembly
 * module with no imports. Every operation on the state, sin and cos included (from wasi-libc's
 * libc.a, linked into the module), runs inside the module, so a given module, initial state and
 * sequence of forces give the same states, bit for bit, on every host.
 *
 * Built by crates/trial/build.rs:
 *   clang --target=wasm32 -O2 -g0 -ffp-contract=off -nostdlib -Wl,--no-entry \
 *         cartpole.c /usr/lib/wasm32-wasi/libc.a
 *
 * docs/trials.md states the equations, the parameters, the integrator, the force clamp and the
 * fallen test; keep the two in step.
 *
 * Exports:
 *   init(x, x_dot, theta, theta_dot)   set the state
 *   step(force) -> fallen              one tick (10 ms) with the force clamped to +-10 N; 1 if
 *                                      the new state is fallen, else 0
 *   state(i) -> double                 0: x, 1: x_dot, 2: theta, 3: theta_dot (NaN otherwise)
 *   fallen() -> int                    1 if the current state is fallen
 *   ticks_per_second() -> int          100
 */

double sin(double);
double cos(double);

#define EXPORT(name) __attribute__((export_name(name)))

/* Parameters (SI units). */
static const double GRAVITY = 9.8;        /* m/s^2 */
static const double CART_MASS = 1.0;      /* kg */
static const double POLE_MASS = 0.1;      /* kg */
static const double HALF_LENGTH = 0.5;    /* m, pivot to the pole's centre of mass */
static const double FORCE_LIMIT = 10.0;   /* N, |force| is clamped to this */
static const double TAU = 0.01;           /* s, one tick */
static const int TICKS_PER_SECOND = 100;
static const double X_LIMIT = 2.4;        /* m */
/* 12 degrees in radians, as 12 * 2 * pi / 360. */
static const double THETA_LIMIT = 12.0 * 2.0 * 3.141592653589793 / 360.0;

typedef struct {
    double x, x_dot, theta, theta_dot;
} State;

static State s;

/* The time derivative of the state under a constant force f. */
static State derivative(State q, double f) {
    const double total_mass = CART_MASS + POLE_MASS;
    const double pole_mass_length = POLE_MASS * HALF_LENGTH;
    double sin_t = sin(q.theta);
    double cos_t = cos(q.theta);
    double temp = (f + pole_mass_length * q.theta_dot * q.theta_dot * sin_t) / total_mass;
    double theta_acc = (GRAVITY * sin_t - cos_t * temp)
        / (HALF_LENGTH * (4.0 / 3.0 - POLE_MASS * cos_t * cos_t / total_mass));
    double x_acc = temp - pole_mass_length * theta_acc * cos_t / total_mass;
    State d = {q.x_dot, x_acc, q.theta_dot, theta_acc};
    return d;
}

/* q + h * d, component by component. */
static State advance(State q, State d, double h) {
    State r = {q.x + h * d.x, q.x_dot + h * d.x_dot, q.theta + h * d.theta,
               q.theta_dot + h * d.theta_dot};
    return r;
}

static int is_fallen(State q) {
    /* Written as "not inside" so that a NaN state counts as fallen. */
    int inside = q.x >= -X_LIMIT && q.x <= X_LIMIT && q.theta >= -THETA_LIMIT
        && q.theta <= THETA_LIMIT;
    return !inside;
}

EXPORT("init") void init(double x, double x_dot, double theta, double theta_dot) {
    State q = {x, x_dot, theta, theta_dot};
    s = q;
}

EXPORT("step") int step(double force) {
    double f = force;
    if (f > FORCE_LIMIT) f = FORCE_LIMIT;
    if (f < -FORCE_LIMIT) f = -FORCE_LIMIT;
    if (f != f) f = 0.0; /* NaN: the runner never sends one; do not let it into the state */
    /* Classic fourth-order Runge-Kutta, the force held constant over the tick. */
    State k1 = derivative(s, f);
    State k2 = derivative(advance(s, k1, TAU / 2.0), f);
    State k3 = derivative(advance(s, k2, TAU / 2.0), f);
    State k4 = derivative(advance(s, k3, TAU), f);
    const double w = TAU / 6.0;
    s.x += w * (k1.x + 2.0 * k2.x + 2.0 * k3.x + k4.x);
    s.x_dot += w * (k1.x_dot + 2.0 * k2.x_dot + 2.0 * k3.x_dot + k4.x_dot);
    s.theta += w * (k1.theta + 2.0 * k2.theta + 2.0 * k3.theta + k4.theta);
    s.theta_dot += w * (k1.theta_dot + 2.0 * k2.theta_dot + 2.0 * k3.theta_dot + k4.theta_dot);
    return is_fallen(s);
}

EXPORT("state") double state(int i) {
    switch (i) {
    case 0: return s.x;
    case 1: return s.x_dot;
    case 2: return s.theta;
    case 3: return s.theta_dot;
    default: return 0.0 / 0.0;
    }
}

EXPORT("fallen") int fallen(void) { return is_fallen(s); }

EXPORT("ticks_per_second") int ticks_per_second(void) { return TICKS_PER_SECOND; }
