// sims/motor/motor.cpp: the speed of a DC motor under an armature voltage, a simulator of the
// plimsoll-sim/1 ABI (docs/simulators.md) in C++, to show the ABI is not C's: a WebAssembly
// module with no imports, like the others.
//
// Built by scripts/build-sim (run by crates/sims/build.rs), which runs:
//   clang++ --target=wasm32 -O2 -g0 -ffp-contract=off -nostdlib -Wl,--no-entry \
//           -std=c++20 -fno-exceptions -fno-rtti -o motor.wasm motor.cpp \
//           /usr/lib/wasm32-wasi/libc.a
// There is no libc++ for wasm32 here, so no standard library, no exceptions, no RTTI. Every
// object with static storage is `constinit`: wasm-ld links a "command" module, each of whose
// exports first runs the module's constructors, so an object with a dynamic initialiser would
// be initialised again at every call (the trial would restart at every step).
//
// The plant, with speed w (rad/s), armature current i (A), voltage V (the action) and a load
// torque that comes on at a given time:
//
//   J dw/dt = K i - b w - load
//   L di/dt = V - R i - K w
//
// integrated with classic fourth-order Runge-Kutta, SUBSTEPS steps per 10 ms tick, V and the
// load held constant over the tick. The trial fails when |i| exceeds 5 A after any substep (the
// winding's fuse; a stalled motor at 12 V would draw 12 A). The score is the fraction of the
// ticks after the first second after which the speed was within 2 % of the target.
//
// Exports (plimsoll-sim/1):
//   memory, plimsoll_sim_abi() -> 1, metadata() -> address of the JSON below
//   buffer() -> address of 4 doubles: init reads speed, target, load, load_at; step reads
//               voltage
//   init() -> 0, or 1 (reason) for a scenario out of range
//   step() -> 0, or 1 when the current exceeded the limit
//   state(i) -> double  0: speed (rad/s), 1: current (A), 2: target (rad/s)
//   reason() -> address of why init refused or step ended the trial
//   score() -> double   in_band_after_1s, 0 before the second's first tick

namespace motor {

// Parameters (SI units): a small permanent-magnet motor.
namespace param {
constexpr double resistance = 1.0;      // ohm, R
constexpr double inductance = 0.02;     // H, L
constexpr double motor_constant = 0.05; // N m/A = V s/rad, K
constexpr double inertia = 2e-4;        // kg m^2, J (rotor and coupling)
constexpr double friction = 1e-4;       // N m s/rad, b (viscous)
constexpr double current_limit = 5.0;   // A
constexpr double voltage_limit = 12.0;  // V, the action's bounds
constexpr int ticks_per_second = 100;
constexpr double tick = 1.0 / ticks_per_second; // s
constexpr int substeps = 10;
constexpr double band = 0.02; // the score: |speed - target| <= 2 % of |target|
// Scenario bounds.
constexpr double min_target = 10.0;  // rad/s, in magnitude (a 2 % band around 0 is empty)
constexpr double max_target = 200.0; // rad/s (no-load speed at 12 V: about 230 rad/s)
constexpr double max_speed = 250.0;  // rad/s, initial speed
constexpr double max_load = 0.2;     // N m (5 A gives 0.25 N m)
constexpr double max_load_at = 1e6;  // s
} // namespace param

constexpr char metadata_json[] = R"json({"abi":1,"name":"motor","version":"1.0.0",)json"
    R"json("description":"The speed of a DC motor (R = 1 ohm, L = 20 mH, K = 0.05 N m/A, J = 2e-4 kg m2, b = 1e-4 N m s) under an armature voltage of -12 to 12 V, with a load torque that comes on during the trial. It fails when the winding current exceeds 5 A. Score: the fraction of ticks after the first second with the speed within 2 % of the target.",)json"
    R"json("ticks_per_second":100,)json"
    R"json("state":[{"name":"speed","unit":"rad/s"},{"name":"current","unit":"A"},{"name":"target","unit":"rad/s"}],)json"
    R"json("action":[{"name":"voltage","unit":"V","min":-12,"max":12}],)json"
    R"json("initial":[{"name":"speed","unit":"rad/s"},{"name":"target","unit":"rad/s"},{"name":"load","unit":"N m"},{"name":"load_at","unit":"s"}],)json"
    R"json("score":{"name":"in_band_after_1s","unit":"1"}})json";

static_assert(param::tick * param::ticks_per_second == 1.0);

// The electrical and mechanical state of the motor.
struct Vars {
    double speed;   // rad/s
    double current; // A

    constexpr Vars plus(Vars d, double h) const { return {speed + h * d.speed, current + h * d.current}; }
};

constexpr double magnitude(double x) { return x < 0.0 ? -x : x; }

// The motor alone: its state and how it moves.
class Motor {
  public:
    constexpr Motor() = default;

    void reset(double speed) { vars_ = {speed, 0.0}; }
    constexpr const Vars &vars() const { return vars_; }

    // Advances by one tick under `voltage` and `load`; false as soon as |current| passed the
    // limit after a substep (the state is left there).
    bool advance(double voltage, double load) {
        constexpr double h = param::tick / param::substeps;
        for (int n = 0; n < param::substeps; n++) {
            const Vars k1 = derivative(vars_, voltage, load);
            const Vars k2 = derivative(vars_.plus(k1, h / 2.0), voltage, load);
            const Vars k3 = derivative(vars_.plus(k2, h / 2.0), voltage, load);
            const Vars k4 = derivative(vars_.plus(k3, h), voltage, load);
            vars_.speed += h / 6.0 * (k1.speed + 2.0 * k2.speed + 2.0 * k3.speed + k4.speed);
            vars_.current += h / 6.0 * (k1.current + 2.0 * k2.current + 2.0 * k3.current + k4.current);
            if (!(magnitude(vars_.current) <= param::current_limit)) return false;
        }
        return true;
    }

  private:
    static constexpr Vars derivative(Vars v, double voltage, double load) {
        using namespace param;
        return {
            (motor_constant * v.current - friction * v.speed - load) / inertia,
            (voltage - resistance * v.current - motor_constant * v.speed) / inductance,
        };
    }

    Vars vars_{0.0, 0.0};
};

// One trial: the motor, the scenario and the score so far.
class Trial {
  public:
    constexpr Trial() = default;

    // NULL when the scenario is accepted, else why not.
    const char *start(double speed, double target, double load, double load_at) {
        using namespace param;
        if (!(magnitude(speed) <= max_speed)) return "the initial speed must be within 250 rad/s of 0";
        if (!(magnitude(target) >= min_target && magnitude(target) <= max_target)) {
            return "the target speed must be 10 to 200 rad/s in magnitude";
        }
        if (!(magnitude(load) <= max_load)) return "the load torque must be within 0.2 N m of 0";
        if (!(load_at >= 0.0 && load_at <= max_load_at)) return "load_at must be 0 to 1000000 s";
        motor_.reset(speed);
        target_ = target;
        load_ = load;
        load_at_ = load_at;
        ticks_ = 0;
        scored_ = 0;
        in_band_ = 0;
        return nullptr;
    }

    // NULL to go on, else why the trial failed.
    const char *step(double voltage) {
        using namespace param;
        // The runner clamps already; the module does not rely on it.
        if (!(voltage >= -voltage_limit)) voltage = -voltage_limit; // NaN too
        if (voltage > voltage_limit) voltage = voltage_limit;
        // The load is on for a tick that starts at or after load_at (tick n starts at n / 100 s).
        const double load = ticks_ >= load_at_ * ticks_per_second ? load_ : 0.0;
        ticks_++;
        if (ticks_ > ticks_per_second) scored_++; // a tick that ends the trial counts, out of band
        if (!motor_.advance(voltage, load)) return "the winding current exceeded 5 A";
        const double error = motor_.vars().speed - target_;
        if (ticks_ > ticks_per_second && magnitude(error) <= band * magnitude(target_)) in_band_++;
        return nullptr;
    }

    double state(int i) const {
        switch (i) {
        case 0: return motor_.vars().speed;
        case 1: return motor_.vars().current;
        case 2: return target_;
        default: return __builtin_nan("");
        }
    }

    double score() const { return scored_ == 0 ? 0.0 : static_cast<double>(in_band_) / scored_; }

  private:
    Motor motor_;
    double target_ = 0.0;
    double load_ = 0.0;
    double load_at_ = 0.0;
    int ticks_ = 0;
    int scored_ = 0;  // ticks after the first second
    int in_band_ = 0; // of those, within the band
};

constinit Trial trial;
// Where the runner writes the initial values (4 doubles) or the voltage (1).
constinit double buffer_area[4] = {};
constinit const char *why = "";

} // namespace motor

#define EXPORT(name) __attribute__((export_name(name)))

extern "C" {

EXPORT("plimsoll_sim_abi") int plimsoll_sim_abi() { return 1; }

EXPORT("metadata") const char *metadata() { return motor::metadata_json; }

EXPORT("buffer") double *buffer() { return motor::buffer_area; }

EXPORT("reason") const char *reason() { return motor::why; }

EXPORT("init") int init() {
    const double *b = motor::buffer_area;
    const char *refused = motor::trial.start(b[0], b[1], b[2], b[3]);
    if (refused) {
        motor::why = refused;
        return 1;
    }
    return 0;
}

EXPORT("step") int step() {
    const char *failed = motor::trial.step(motor::buffer_area[0]);
    if (failed) {
        motor::why = failed;
        return 1;
    }
    return 0;
}

EXPORT("state") double state(int i) { return motor::trial.state(i); }

EXPORT("score") double score() { return motor::trial.score(); }

} // extern "C"
