/*
 * sims/cartpole/cartpole.c: the cart-pole of Barto, Sutton & Anderson (1983) as a simulator of
 * the plimsoll-sim/1 ABI (docs/simulators.md), a WebAssembly module with no imports. Every
 * operation on the state, sin and cos included (from wasi-libc's libc.a, linked into the
 * module), runs inside the module, so a given module, initial state and sequence of forces give
 * the same states, bit for bit, on every host.
 *
 * Built by scripts/build-sim (run by crates/sims/build.rs), which runs:
 *   clang --target=wasm32 -O2 -g0 -ffp-contract=off -nostdlib -Wl,--no-entry \
 *         -o cartpole.wasm cartpole.c /usr/lib/wasm32-wasi/libc.a
 *
 * docs/trials.md states the equations, the parameters, the integrator, the force clamp and the
 * fallen test; keep the two in step. The dynamics are those of the module the runner embedded
 * before plimsoll-sim/1, to the bit: only the interface around them changed.
 *
 * Exports (plimsoll-sim/1):
 *   memory, plimsoll_sim_abi() -> 1, metadata() -> address of the JSON below
 *   buffer() -> address of 4 doubles: init reads x, x_dot, theta, theta_dot; step reads force
 *   init() -> 0, or 1 when the initial state is already fallen
 *   step() -> 0, or 1 when the new state is fallen (one tick, 10 ms, force clamped to +-10 N)
 *   state(i) -> double      0: x, 1: x_dot, 2: theta, 3: theta_dot (NaN otherwise)
 *   reason() -> address of why init refused or step ended the trial
 * No score.
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
static const double TAU = 0.01;           /* s, one tick (100 ticks per second) */
static const double X_LIMIT = 2.4;        /* m */
/* 12 degrees in radians, as 12 * 2 * pi / 360. */
static const double THETA_LIMIT = 12.0 * 2.0 * 3.141592653589793 / 360.0;

static const char METADATA[] =
    "{\"abi\":1,\"name\":\"cartpole\",\"version\":\"1.0.0\","
    "\"description\":\"The cart-pole of Barto, Sutton and Anderson (1983): keep the pole within "
    "12 degrees of upright and the cart within 2.4 m of the centre by pushing the cart.\","
    "\"ticks_per_second\":100,"
    "\"state\":[{\"name\":\"x\",\"unit\":\"m\"},{\"name\":\"x_dot\",\"unit\":\"m/s\"},"
    "{\"name\":\"theta\",\"unit\":\"rad\"},{\"name\":\"theta_dot\",\"unit\":\"rad/s\"}],"
    "\"action\":[{\"name\":\"force\",\"unit\":\"N\",\"min\":-10,\"max\":10}],"
    "\"initial\":[{\"name\":\"x\",\"unit\":\"m\"},{\"name\":\"x_dot\",\"unit\":\"m/s\"},"
    "{\"name\":\"theta\",\"unit\":\"rad\"},{\"name\":\"theta_dot\",\"unit\":\"rad/s\"}]}";

typedef struct {
    double x, x_dot, theta, theta_dot;
} State;

static State s;
/* Where the runner writes the initial state (4 doubles) or the force (1). */
static double buf[4];
static const char *why = "";

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

/*
 * NULL when q is inside the limits, else why not. Written as "not inside" so that a NaN state
 * counts as fallen; the pole is named first when both limits are passed.
 */
static const char *fallen(State q) {
    if (!(q.theta >= -THETA_LIMIT && q.theta <= THETA_LIMIT)) {
        return "the pole fell past 12 degrees (|theta| > 0.2094 rad)";
    }
    if (!(q.x >= -X_LIMIT && q.x <= X_LIMIT)) {
        return "the cart left the track (|x| > 2.4 m)";
    }
    return 0;
}

EXPORT("plimsoll_sim_abi") int plimsoll_sim_abi(void) { return 1; }

EXPORT("metadata") const char *metadata(void) { return METADATA; }

EXPORT("buffer") double *buffer(void) { return buf; }

EXPORT("reason") const char *reason(void) { return why; }

EXPORT("init") int init(void) {
    State q = {buf[0], buf[1], buf[2], buf[3]};
    if (fallen(q)) {
        why = "the initial state is already fallen";
        return 1;
    }
    s = q;
    return 0;
}

EXPORT("step") int step(void) {
    double f = buf[0];
    /* The runner clamps already; keep the module's own clamp so the dynamics hold alone. */
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
    const char *fell = fallen(s);
    if (fell) {
        why = fell;
        return 1;
    }
    return 0;
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
