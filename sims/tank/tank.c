/*
 * sims/tank/tank.c: a water tank with an inlet valve and a free outlet, a simulator of the
 * plimsoll-sim/1 ABI (docs/simulators.md) in C. A WebAssembly module with no imports; the one
 * square root is the wasm instruction f64.sqrt, exactly rounded on every host.
 *
 * Built by scripts/build-sim (run by crates/sims/build.rs), which runs:
 *   clang --target=wasm32 -O2 -g0 -ffp-contract=off -nostdlib -Wl,--no-entry \
 *         -o tank.wasm tank.c /usr/lib/wasm32-wasi/libc.a
 *
 * The plant: a vertical tank of cross-section AREA and height HEIGHT. Water comes in through a
 * valve, inflow = valve * MAX_INFLOW (valve in [0, 1], the controller's action), and leaves
 * through an orifice at the bottom, Torricelli's outflow ORIFICE * sqrt(2 g h), and through a
 * consumer's pump that draws `demand` m3/s on top. So
 *
 *   AREA * dh/dt = valve * MAX_INFLOW - ORIFICE * sqrt(2 g h) - demand
 *
 * integrated with classic fourth-order Runge-Kutta, SUBSTEPS steps per tick, the valve and the
 * demand held constant over the tick. The demand is a disturbance the controller does not
 * know in advance: a piecewise-constant draw, a new level uniform in [0, max_demand] held for
 * 10 to 30 s, drawn from a xorshift64* generator seeded by the scenario's `seed` (so a
 * scenario's disturbance is the same on every host, and another seed gives another one).
 * The controller sees it only through `outflow`, the flow meters' mean over the last tick, so
 * a change of demand shows one tick after it happened.
 *
 * The trial fails when the tank overflows (h > HEIGHT) or runs dry (h <= 0), checked after
 * every substep. The score, time_in_band, is the fraction of the ticks run after which the
 * level was within 5 % of the set point (a tick that ended the trial counts, out of the band).
 *
 * Exports (plimsoll-sim/1):
 *   memory, plimsoll_sim_abi() -> 1, metadata() -> address of the JSON below
 *   buffer() -> address of 4 doubles: init reads level, setpoint, max_demand, seed; step reads
 *               valve
 *   init() -> 0, or 1 (reason) for a scenario out of range
 *   step() -> 0, or 1 when the tank overflowed or ran dry
 *   state(i) -> double  0: level (m), 1: setpoint (m), 2: inflow, 3: outflow (m3/s, each the
 *                       mean over the last tick; before the first, 0 and the outflow at the
 *                       initial level)
 *   reason() -> address of why init refused or step ended the trial
 *   score() -> double   time_in_band, 0 before the first tick
 */

typedef unsigned long long u64;

#define EXPORT(name) __attribute__((export_name(name)))

/* Parameters (SI units). */
static const double GRAVITY = 9.81;      /* m/s^2 */
static const double AREA = 0.25;         /* m^2, the tank's cross-section (a 500 L tank) */
static const double HEIGHT = 2.0;        /* m, it overflows above this */
static const double MAX_INFLOW = 0.02;   /* m^3/s through the valve fully open */
static const double ORIFICE = 0.002;     /* m^2, the outlet's effective area */
static const double TICK = 0.1;          /* s (10 ticks per second) */
static const int SUBSTEPS = 10;
static const double BAND = 0.05;         /* time_in_band: |level - setpoint| <= 5 % of setpoint */
static const int HOLD_MIN_TICKS = 100;   /* a demand level is held 10 to 30 s */
static const int HOLD_SPAN_TICKS = 201;
/* A seed is a whole number a double holds exactly. */
static const double SEED_LIMIT = 9007199254740992.0; /* 2^53 */

static const char METADATA[] =
    "{\"abi\":1,\"name\":\"tank\",\"version\":\"1.0.0\","
    "\"description\":\"A 2 m high water tank of 0.25 m2 cross-section: an inlet valve "
    "(inflow = valve x 0.02 m3/s), a free outlet (Torricelli) and a consumer drawing a varying "
    "demand; inflow and outflow are the meters' means over the last tick. Hold the level at "
    "the set point; it fails if the tank overflows or runs dry. "
    "Score: the fraction of ticks with the level within 5 % of the set point.\","
    "\"ticks_per_second\":10,"
    "\"state\":[{\"name\":\"level\",\"unit\":\"m\"},{\"name\":\"setpoint\",\"unit\":\"m\"},"
    "{\"name\":\"inflow\",\"unit\":\"m3/s\"},{\"name\":\"outflow\",\"unit\":\"m3/s\"}],"
    "\"action\":[{\"name\":\"valve\",\"unit\":\"1\",\"min\":0,\"max\":1}],"
    "\"initial\":[{\"name\":\"level\",\"unit\":\"m\"},{\"name\":\"setpoint\",\"unit\":\"m\"},"
    "{\"name\":\"max_demand\",\"unit\":\"m3/s\"},{\"name\":\"seed\",\"unit\":\"\"}],"
    "\"score\":{\"name\":\"time_in_band\",\"unit\":\"1\"}}";

static double buf[4];
static const char *why = "";

static double level;      /* m */
static double setpoint;   /* m */
static double inflow;     /* m^3/s, mean over the last tick */
static double outflow;    /* m^3/s, mean over the last tick */
static double max_demand; /* m^3/s */
static double demand;     /* m^3/s, now */
static int hold;          /* ticks left at this demand */
static u64 rng;
static int ticks;
static int in_band;

/* xorshift64* (Vigna 2016): the next 64 random bits. */
static u64 next_random(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [0, 1), 53 bits. */
static double uniform(void) { return (double)(next_random() >> 11) * (1.0 / 9007199254740992.0); }

static void new_demand(void) {
    demand = max_demand * uniform();
    hold = HOLD_MIN_TICKS + (int)(next_random() % (u64)HOLD_SPAN_TICKS);
}

static double orifice_outflow(double h) {
    return ORIFICE * __builtin_sqrt(2.0 * GRAVITY * (h > 0.0 ? h : 0.0));
}

/* dh/dt under a net inflow q_in - demand. */
static double derivative(double h, double q_in) {
    return (q_in - orifice_outflow(h) - demand) / AREA;
}

/* The meters' means over a tick that began at level `start` (what went out is what came in
 * less what stayed in the tank). */
static void end_tick(double q_in, double start) {
    inflow = q_in;
    outflow = q_in - AREA * (level - start) / TICK;
}

EXPORT("plimsoll_sim_abi") int plimsoll_sim_abi(void) { return 1; }

EXPORT("metadata") const char *metadata(void) { return METADATA; }

EXPORT("buffer") double *buffer(void) { return buf; }

EXPORT("reason") const char *reason(void) { return why; }

EXPORT("init") int init(void) {
    double h = buf[0], sp = buf[1], d = buf[2], seed = buf[3];
    if (!(h > 0.0 && h <= HEIGHT)) {
        why = "the initial level must be above 0 m and at most 2 m";
        return 1;
    }
    if (!(sp > 0.0 && sp <= HEIGHT)) {
        why = "the set point must be above 0 m and at most 2 m";
        return 1;
    }
    if (!(d >= 0.0 && d <= MAX_INFLOW)) {
        why = "max_demand must be between 0 and 0.02 m3/s";
        return 1;
    }
    if (!(seed >= 0.0 && seed < SEED_LIMIT && seed == (double)(u64)seed)) {
        why = "the seed must be a whole number from 0 to 2^53 - 1";
        return 1;
    }
    level = h;
    setpoint = sp;
    max_demand = d;
    /* Mixed so that nearby seeds give unrelated sequences; xorshift needs a state that is not 0. */
    rng = ((u64)seed ^ 0x9E3779B97F4A7C15ULL) * 0xBF58476D1CE4E5B9ULL;
    if (rng == 0) rng = 1;
    new_demand();
    inflow = 0.0;
    outflow = orifice_outflow(level) + demand;
    ticks = 0;
    in_band = 0;
    return 0;
}

EXPORT("step") int step(void) {
    double valve = buf[0];
    /* The runner clamps already; the module does not rely on it. */
    if (!(valve >= 0.0)) valve = 0.0; /* NaN too */
    if (valve > 1.0) valve = 1.0;
    double q_in = valve * MAX_INFLOW;
    double start = level;
    if (hold == 0) new_demand(); /* the demand changes at the start of a tick */
    hold--;
    ticks++; /* a tick that ends the trial counts, out of the band */
    const double h_step = TICK / SUBSTEPS;
    for (int i = 0; i < SUBSTEPS; i++) {
        double k1 = derivative(level, q_in);
        double k2 = derivative(level + h_step / 2.0 * k1, q_in);
        double k3 = derivative(level + h_step / 2.0 * k2, q_in);
        double k4 = derivative(level + h_step * k3, q_in);
        level += h_step / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4);
        if (level > HEIGHT) {
            end_tick(q_in, start);
            why = "the tank overflowed (level above 2 m)";
            return 1;
        }
        if (level <= 0.0) {
            level = 0.0;
            end_tick(q_in, start);
            why = "the tank ran dry (level down to 0 m)";
            return 1;
        }
    }
    end_tick(q_in, start);
    double error = level - setpoint;
    if (error <= BAND * setpoint && -error <= BAND * setpoint) in_band++;
    return 0;
}

EXPORT("state") double state(int i) {
    switch (i) {
    case 0: return level;
    case 1: return setpoint;
    case 2: return inflow;
    case 3: return outflow;
    default: return 0.0 / 0.0;
    }
}

EXPORT("score") double score(void) { return ticks == 0 ? 0.0 : (double)in_band / (double)ticks; }
