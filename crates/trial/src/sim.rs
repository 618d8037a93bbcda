//! The simulator: a WebAssembly module run by wasmtime with no imports, a fuel budget per call
//! and a memory limit, so a broken or hostile module ends in a clean error, never a hang.
//!
//! The interface a simulator module exports (docs/trials.md, "The simulator"):
//! `init(f64 x4)`, `step(f64) -> i32` (1 when the new state is fallen), `state(i32) -> f64`,
//! `fallen() -> i32`, `ticks_per_second() -> i32`, and its memory.

use std::time::Instant;

use sha2::{Digest as _, Sha256};
use wasmtime::{
    Config, Engine, Instance, Module, Store, StoreLimits, StoreLimitsBuilder, Trap, TypedFunc,
};

/// Fuel (roughly, wasm instructions) one call may use. A cart-pole step uses about 2,000
/// (measured with `--bench-sim`); this leaves room for any sane simulator and stops a loop.
pub const CALL_FUEL: u64 = 10_000_000;

/// Linear memory one instance may hold. The cart-pole needs two 64 KiB pages.
pub const MEMORY_LIMIT_BYTES: usize = 16 << 20;

/// The four state variables, SI units, angle in radians (0 = upright).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Cart position, m.
    pub x: f64,
    /// Cart velocity, m/s.
    pub x_dot: f64,
    /// Pole angle from upright, rad.
    pub theta: f64,
    /// Pole angular velocity, rad/s.
    pub theta_dot: f64,
}

/// Loading a simulator module failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadSimulatorError {
    /// The module file could not be read.
    #[error("cannot read the simulator module {path}")]
    Read {
        /// The path.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// wasmtime refused the configuration (a bug here).
    #[error("cannot set up wasmtime: {0}")]
    Engine(String),
    /// Not valid WebAssembly.
    #[error("the simulator is not a valid WebAssembly module: {0}")]
    Invalid(String),
    /// It imports something: a simulator must carry all its maths.
    #[error(
        "the simulator module imports {0}; a simulator must not import anything (link its maths in, e.g. wasi-libc's libc.a)"
    )]
    Imports(String),
    /// An export is missing or has the wrong type.
    #[error("the simulator module does not export `{name}` as {signature}: {detail}")]
    Export {
        /// The export.
        name: &'static str,
        /// Its expected signature.
        signature: &'static str,
        /// What wasmtime said.
        detail: String,
    },
}

/// The simulator failed while running: it trapped, ran out of fuel or memory, or broke its
/// contract. The trial cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    /// Out of fuel: the call did not finish within [`CALL_FUEL`].
    #[error(
        "the simulator ran out of fuel in `{call}` ({CALL_FUEL} units per call): it loops or is far too slow"
    )]
    OutOfFuel {
        /// The export called.
        call: &'static str,
    },
    /// It trapped (including a memory grow past the limit).
    #[error("the simulator trapped in `{call}`: {detail}")]
    Trap {
        /// The export called.
        call: &'static str,
        /// The trap.
        detail: String,
    },
    /// Instantiation failed (for instance, its memory exceeds the limit).
    #[error("cannot instantiate the simulator: {0}")]
    Instantiate(String),
    /// It broke its contract (an export missing, `ticks_per_second` out of range).
    #[error("the simulator broke its contract: {0}")]
    Contract(String),
}

/// A compiled simulator module, ready to be instantiated once per trial.
#[derive(Debug, Clone)]
pub struct SimulatorModule {
    engine: Engine,
    module: Module,
    sha256: String,
}

impl SimulatorModule {
    /// Reads and compiles the module at `path`.
    pub fn from_file(path: &std::path::Path) -> Result<Self, LoadSimulatorError> {
        let bytes = std::fs::read(path).map_err(|source| LoadSimulatorError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_bytes(&bytes)
    }

    /// Compiles `bytes` and checks the interface.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, LoadSimulatorError> {
        let mut config = Config::new();
        config.consume_fuel(true);
        // Determinism: NaN bit patterns canonical, relaxed SIMD in its deterministic mode.
        config.cranelift_nan_canonicalization(true);
        config.relaxed_simd_deterministic(true);
        // Reserve only the memory an instance may have (plus a small guard), not wasmtime's
        // default 4 GiB of address space per memory: the runner must also work under an
        // address-space limit (RLIMIT_AS). Bounds are then checked explicitly.
        config.memory_reservation(MEMORY_LIMIT_BYTES as u64);
        config.memory_guard_size(64 * 1024);
        config.memory_reservation_for_growth(0);
        // No copy-on-write memory image: it would be a memfd descriptor of the runner holding
        // the simulator's initial memory, and a sandbox whose /proc lets another uid open a
        // descriptor (gVisor) would hand it to the controller (docs/trials.md: the controller
        // sees descriptor numbers, never their contents). Data segments are copied instead.
        config.memory_init_cow(false);
        let engine = Engine::new(&config).map_err(|e| LoadSimulatorError::Engine(e.to_string()))?;
        let module = Module::new(&engine, bytes)
            .map_err(|e| LoadSimulatorError::Invalid(format!("{e:#}")))?;
        let imports: Vec<String> = module
            .imports()
            .map(|i| format!("`{}.{}`", i.module(), i.name()))
            .collect();
        if !imports.is_empty() {
            return Err(LoadSimulatorError::Imports(imports.join(", ")));
        }
        let sha256 = hex::encode(Sha256::digest(bytes));
        let loaded = SimulatorModule {
            engine,
            module,
            sha256,
        };
        // Check the exports' types now, so a wrong module fails before anything starts.
        loaded.check_exports()?;
        Ok(loaded)
    }

    /// Lowercase hex SHA-256 of the module's bytes: `simulator_sha256` in the verdict.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// A fresh instance in its own store (fuel and memory limits set), not yet initialised.
    pub fn instantiate(&self) -> Result<Simulator, SimulatorError> {
        let limits = StoreLimitsBuilder::new()
            .memory_size(MEMORY_LIMIT_BYTES)
            .memories(1)
            .tables(4)
            .table_elements(10_000)
            .instances(1)
            .trap_on_grow_failure(true)
            .build();
        let mut store = Store::new(&self.engine, limits);
        store.limiter(|limits| limits);
        store
            .set_fuel(CALL_FUEL)
            .map_err(|e| SimulatorError::Instantiate(e.to_string()))?;
        let instance = Instance::new(&mut store, &self.module, &[])
            .map_err(|e| classify(e, "start"))
            .map_err(|e| match e {
                SimulatorError::Trap { detail, .. } => SimulatorError::Instantiate(detail),
                other => other,
            })?;
        let exports = Exports::get(&mut store, &instance)
            .map_err(|e| SimulatorError::Contract(e.to_string()))?;
        let mut sim = Simulator { store, exports };
        let tps = sim.call("ticks_per_second", |s, e| {
            e.ticks_per_second.call(&mut *s, ())
        })?;
        if !(1..=1_000_000).contains(&tps) {
            return Err(SimulatorError::Contract(format!(
                "ticks_per_second() returned {tps}; it must be between 1 and 1000000"
            )));
        }
        Ok(sim)
    }

    fn check_exports(&self) -> Result<(), LoadSimulatorError> {
        for (name, signature, ok) in [
            ("init", "(f64, f64, f64, f64) -> ()", {
                self.export_type_is(
                    "init",
                    &[
                        wasmtime::ValType::F64,
                        wasmtime::ValType::F64,
                        wasmtime::ValType::F64,
                        wasmtime::ValType::F64,
                    ],
                    &[],
                )
            }),
            ("step", "(f64) -> i32", {
                self.export_type_is("step", &[wasmtime::ValType::F64], &[wasmtime::ValType::I32])
            }),
            ("state", "(i32) -> f64", {
                self.export_type_is(
                    "state",
                    &[wasmtime::ValType::I32],
                    &[wasmtime::ValType::F64],
                )
            }),
            ("fallen", "() -> i32", {
                self.export_type_is("fallen", &[], &[wasmtime::ValType::I32])
            }),
            ("ticks_per_second", "() -> i32", {
                self.export_type_is("ticks_per_second", &[], &[wasmtime::ValType::I32])
            }),
        ] {
            ok.map_err(|detail| LoadSimulatorError::Export {
                name,
                signature,
                detail,
            })?;
        }
        Ok(())
    }

    fn export_type_is(
        &self,
        name: &str,
        params: &[wasmtime::ValType],
        results: &[wasmtime::ValType],
    ) -> Result<(), String> {
        let ty = self
            .module
            .get_export(name)
            .ok_or_else(|| "no such export".to_owned())?;
        let func = ty.func().ok_or_else(|| "it is not a function".to_owned())?;
        let same = |a: &mut dyn ExactSizeIterator<Item = wasmtime::ValType>,
                    b: &[wasmtime::ValType]| {
            a.len() == b.len() && a.zip(b).all(|(x, y)| wasmtime::ValType::eq(&x, y))
        };
        if same(&mut func.params(), params) && same(&mut func.results(), results) {
            Ok(())
        } else {
            Err(format!("it is {func}"))
        }
    }
}

struct Exports {
    init: TypedFunc<(f64, f64, f64, f64), ()>,
    step: TypedFunc<f64, i32>,
    state: TypedFunc<i32, f64>,
    fallen: TypedFunc<(), i32>,
    ticks_per_second: TypedFunc<(), i32>,
}

impl Exports {
    fn get(store: &mut Store<StoreLimits>, instance: &Instance) -> wasmtime::Result<Self> {
        Ok(Exports {
            init: instance.get_typed_func(&mut *store, "init")?,
            step: instance.get_typed_func(&mut *store, "step")?,
            state: instance.get_typed_func(&mut *store, "state")?,
            fallen: instance.get_typed_func(&mut *store, "fallen")?,
            ticks_per_second: instance.get_typed_func(&mut *store, "ticks_per_second")?,
        })
    }
}

/// One instance of a simulator: the state of one trial.
pub struct Simulator {
    store: Store<StoreLimits>,
    exports: Exports,
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator").finish_non_exhaustive()
    }
}

impl Simulator {
    /// Sets the state.
    pub fn init(&mut self, s: &State) -> Result<(), SimulatorError> {
        let args = (s.x, s.x_dot, s.theta, s.theta_dot);
        self.call("init", |st, e| e.init.call(&mut *st, args))
    }

    /// One tick under `force` (the module clamps it). True when the new state is fallen.
    pub fn step(&mut self, force: f64) -> Result<bool, SimulatorError> {
        let fallen = self.call("step", |st, e| e.step.call(&mut *st, force))?;
        Ok(fallen != 0)
    }

    /// The current state.
    pub fn state(&mut self) -> Result<State, SimulatorError> {
        let mut v = [0.0; 4];
        for (i, slot) in v.iter_mut().enumerate() {
            *slot = self.call("state", |st, e| e.state.call(&mut *st, i as i32))?;
        }
        Ok(State {
            x: v[0],
            x_dot: v[1],
            theta: v[2],
            theta_dot: v[3],
        })
    }

    /// Whether the current state is fallen.
    pub fn fallen(&mut self) -> Result<bool, SimulatorError> {
        Ok(self.call("fallen", |st, e| e.fallen.call(&mut *st, ()))? != 0)
    }

    /// Ticks per simulated second (100 for the cart-pole: a 10 ms tick).
    pub fn ticks_per_second(&mut self) -> Result<u32, SimulatorError> {
        let tps = self.call("ticks_per_second", |st, e| {
            e.ticks_per_second.call(&mut *st, ())
        })?;
        Ok(tps as u32)
    }

    /// Calls one export with a fresh fuel budget.
    fn call<T>(
        &mut self,
        name: &'static str,
        f: impl FnOnce(&mut Store<StoreLimits>, &Exports) -> wasmtime::Result<T>,
    ) -> Result<T, SimulatorError> {
        self.store
            .set_fuel(CALL_FUEL)
            .map_err(|e| SimulatorError::Contract(e.to_string()))?;
        f(&mut self.store, &self.exports).map_err(|e| classify(e, name))
    }

    /// Fuel left after the last call.
    fn fuel_left(&self) -> u64 {
        self.store.get_fuel().unwrap_or(0)
    }
}

fn classify(e: wasmtime::Error, call: &'static str) -> SimulatorError {
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => SimulatorError::OutOfFuel { call },
        _ => SimulatorError::Trap {
            call,
            detail: format!("{e:#}"),
        },
    }
}

/// What `--bench-sim` measured.
#[derive(Debug, Clone, Copy)]
pub struct SimBench {
    /// Steps run.
    pub steps: u64,
    /// Wall time of the steps (reading the state after each included).
    pub seconds: f64,
    /// Fuel one step used.
    pub fuel_per_step: u64,
}

/// Runs `steps` steps of a fresh instance under a fixed stabilising law computed here
/// (the state read back after each step, as a trial does), from a small tilt.
pub fn bench(module: &SimulatorModule, steps: u64) -> Result<SimBench, SimulatorError> {
    let mut sim = module.instantiate()?;
    let start_state = State {
        x: 0.3,
        x_dot: -0.1,
        theta: 0.08,
        theta_dot: 0.05,
    };
    sim.init(&start_state)?;
    sim.step(0.0)?;
    let fuel_per_step = CALL_FUEL - sim.fuel_left();
    sim.init(&start_state)?;
    let started = Instant::now();
    let mut s = start_state;
    for _ in 0..steps {
        let force = s.x + 2.0 * s.x_dot + 25.0 * s.theta + 5.0 * s.theta_dot;
        if sim.step(force)? {
            sim.init(&start_state)?;
        }
        s = sim.state()?;
    }
    Ok(SimBench {
        steps,
        seconds: started.elapsed().as_secs_f64(),
        fuel_per_step,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cartpole() -> SimulatorModule {
        SimulatorModule::from_bytes(crate::CARTPOLE_WASM).unwrap()
    }

    #[test]
    fn the_built_in_module_loads_and_steps() {
        let m = cartpole();
        assert_eq!(m.sha256().len(), 64);
        let mut sim = m.instantiate().unwrap();
        assert_eq!(sim.ticks_per_second().unwrap(), 100);
        let s0 = State {
            x: 0.0,
            x_dot: 0.0,
            theta: 0.1,
            theta_dot: 0.0,
        };
        sim.init(&s0).unwrap();
        assert_eq!(sim.state().unwrap(), s0);
        assert!(!sim.fallen().unwrap());
        // With no force the pole falls (theta grows past 12 degrees) within two seconds.
        let mut fell = None;
        for k in 1..=200 {
            if sim.step(0.0).unwrap() {
                fell = Some(k);
                break;
            }
        }
        let k = fell.expect("the pole should fall with no force");
        assert!(sim.fallen().unwrap());
        assert!(
            sim.state().unwrap().theta > 12f64.to_radians(),
            "fell at {k}"
        );
    }

    #[test]
    fn the_force_is_clamped_to_ten_newtons() {
        let m = cartpole();
        let s0 = State {
            x: 0.0,
            x_dot: 0.0,
            theta: 0.0,
            theta_dot: 0.0,
        };
        let run = |f: f64| {
            let mut sim = m.instantiate().unwrap();
            sim.init(&s0).unwrap();
            sim.step(f).unwrap();
            sim.state().unwrap()
        };
        assert_eq!(run(10.0), run(1e6));
        assert_eq!(run(-10.0), run(-1e300));
        assert_ne!(run(9.0), run(10.0));
    }

    #[test]
    fn fallen_test_matches_the_documented_limits() {
        let m = cartpole();
        let mut sim = m.instantiate().unwrap();
        let limit = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
        for (x, theta, fallen) in [
            (2.4, 0.0, false),
            (-2.4, 0.0, false),
            (2.400001, 0.0, true),
            (0.0, limit, false),
            (0.0, -limit, false),
            (0.0, limit + 1e-12, true),
            (f64::NAN, 0.0, true),
        ] {
            sim.init(&State {
                x,
                x_dot: 0.0,
                theta,
                theta_dot: 0.0,
            })
            .unwrap();
            assert_eq!(sim.fallen().unwrap(), fallen, "x {x} theta {theta}");
        }
    }
}
