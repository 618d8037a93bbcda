//! The simulator: a WebAssembly module of the `plimsoll-sim/1` ABI (docs/simulators.md), run by
//! wasmtime with no imports, a fuel budget per call and a memory limit, so a broken or hostile
//! module ends in a clean error, never a hang.

use std::time::Instant;

use plimsoll_wire::simulators::simulator_name_ok;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use wasmtime::{
    Config, Engine, Instance, Memory, Module, Store, StoreLimits, StoreLimitsBuilder, Trap,
    TypedFunc, ValType,
};

/// Fuel (roughly, wasm instructions) one call may use. A cart-pole step uses about 1,000
/// (measured with `--bench-sim`); this leaves room for any sane simulator and stops a loop.
pub const CALL_FUEL: u64 = 10_000_000;

/// Linear memory one instance may hold. The cart-pole needs two 64 KiB pages.
pub const MEMORY_LIMIT_BYTES: usize = 16 << 20;

/// The ABI version this runner speaks.
pub const ABI_VERSION: i32 = 1;

/// The longest metadata text read, NUL excluded.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

/// The most bytes of a `reason` text read.
pub const MAX_REASON_BYTES: usize = 200;

/// The largest simulator module read from a file.
pub const MAX_MODULE_BYTES: u64 = 64 << 20;

/// A named quantity of the simulator: a state variable, a scenario's initial value, or the
/// score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variable {
    /// `[A-Za-z_][A-Za-z0-9_]{0,31}`.
    pub name: String,
    /// 0 to 16 printable ASCII characters.
    pub unit: String,
}

/// One component of the action vector, with the bounds the runner clamps it to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionVariable {
    /// `[A-Za-z_][A-Za-z0-9_]{0,31}`.
    pub name: String,
    /// 0 to 16 printable ASCII characters.
    pub unit: String,
    /// The least value the simulator is given.
    pub min: f64,
    /// The greatest.
    pub max: f64,
}

/// What a simulator says about itself (docs/simulators.md, "Metadata").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// The ABI version: 1.
    pub abi: u32,
    /// `[a-z0-9][a-z0-9._-]{0,63}`.
    pub name: String,
    /// 1 to 32 printable ASCII characters.
    pub version: String,
    /// At most 500 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Simulated ticks per simulated second.
    pub ticks_per_second: u32,
    /// What the controller sees each tick, in order.
    pub state: Vec<Variable>,
    /// What the controller answers each tick, in order.
    pub action: Vec<ActionVariable>,
    /// The numbers a scenario gives `init`, in order.
    #[serde(default)]
    pub initial: Vec<Variable>,
    /// The score, when the simulator scores a trial (higher is better).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<Variable>,
}

impl Metadata {
    /// Parses and checks the metadata text.
    pub fn parse(text: &[u8]) -> Result<Metadata, String> {
        let m: Metadata = serde_json::from_slice(text).map_err(|e| e.to_string())?;
        m.check()?;
        Ok(m)
    }

    fn check(&self) -> Result<(), String> {
        if self.abi != ABI_VERSION as u32 {
            return Err(format!(
                "abi is {}; this runner speaks plimsoll-sim/{ABI_VERSION}",
                self.abi
            ));
        }
        if !simulator_name_ok(&self.name) {
            return Err(format!(
                "name {:?} does not match [a-z0-9][a-z0-9._-]{{0,63}}",
                self.name
            ));
        }
        if self.version.is_empty()
            || self.version.len() > 32
            || !self.version.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(format!(
                "version {:?} must be 1 to 32 printable ASCII characters",
                self.version
            ));
        }
        if self.description.as_ref().is_some_and(|d| d.len() > 500) {
            return Err("description is longer than 500 bytes".into());
        }
        if !(1..=1_000_000).contains(&self.ticks_per_second) {
            return Err(format!(
                "ticks_per_second is {}; it must be between 1 and 1000000",
                self.ticks_per_second
            ));
        }
        check_variables(
            "state",
            self.state.iter().map(|v| (&v.name, &v.unit)),
            1,
            64,
        )?;
        check_variables(
            "action",
            self.action.iter().map(|v| (&v.name, &v.unit)),
            1,
            16,
        )?;
        check_variables(
            "initial",
            self.initial.iter().map(|v| (&v.name, &v.unit)),
            0,
            64,
        )?;
        if let Some(s) = &self.score {
            check_variables("score", std::iter::once((&s.name, &s.unit)), 1, 1)?;
        }
        for a in &self.action {
            if !(a.min.is_finite() && a.max.is_finite() && a.min < a.max) {
                return Err(format!(
                    "action {}: min ({}) and max ({}) must be finite with min < max",
                    a.name, a.min, a.max
                ));
            }
        }
        Ok(())
    }

    /// The doubles `buffer` must hold.
    pub fn buffer_len(&self) -> usize {
        self.initial.len().max(self.action.len())
    }
}

fn check_variables<'a>(
    list: &str,
    vars: impl Iterator<Item = (&'a String, &'a String)>,
    least: usize,
    most: usize,
) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut count = 0;
    for (name, unit) in vars {
        count += 1;
        let b = name.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= 32
            && (b[0].is_ascii_alphabetic() || b[0] == b'_')
            && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_');
        if !ok {
            return Err(format!(
                "{list} variable {name:?} does not match [A-Za-z_][A-Za-z0-9_]{{0,31}}"
            ));
        }
        if unit.len() > 16 || !unit.bytes().all(|c| c.is_ascii_graphic() || c == b' ') {
            return Err(format!(
                "{list} variable {name}: unit {unit:?} must be 0 to 16 printable ASCII characters"
            ));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("{list} variable {name} is listed twice"));
        }
    }
    if count < least || count > most {
        return Err(format!(
            "{list} has {count} variables; it must have {least} to {most}"
        ));
    }
    Ok(())
}

/// Loading a simulator module failed: nothing of a trial started.
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
    /// The module file is larger than [`MAX_MODULE_BYTES`].
    #[error("the simulator module {path} is larger than {MAX_MODULE_BYTES} bytes")]
    TooLarge {
        /// The path.
        path: std::path::PathBuf,
    },
    /// wasmtime refused the configuration (a bug here).
    #[error("cannot set up wasmtime: {0}")]
    Engine(String),
    /// Not valid WebAssembly.
    #[error("the simulator is not a valid WebAssembly module: {0}")]
    Invalid(String),
    /// It imports something: a simulator must carry all its maths.
    #[error(
        "the simulator module imports {0}; a simulator must not import anything (link its maths in, e.g. wasi-libc's libc.a; docs/simulators.md)"
    )]
    Imports(String),
    /// An export is missing or has the wrong type.
    #[error("the simulator module does not export `{name}` as {signature}: {detail}")]
    Export {
        /// The export.
        name: &'static str,
        /// Its expected signature.
        signature: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// It speaks another ABI version.
    #[error("the simulator speaks plimsoll-sim/{0}; this runner speaks plimsoll-sim/{ABI_VERSION}")]
    Abi(i32),
    /// Its metadata is not as docs/simulators.md says.
    #[error("the simulator's metadata is not valid: {0}")]
    Metadata(String),
    /// It failed while its metadata was read.
    #[error("the simulator failed while its metadata was read: {0}")]
    Running(SimulatorError),
}

/// The simulator failed while running: it trapped, ran out of fuel or memory, or broke its
/// contract. The trial cannot go on, and it is not the controller's fault.
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
    /// It broke its contract (a value out of range, a non-finite state, a bad address).
    #[error("the simulator broke its contract: {0}")]
    Contract(String),
}

/// A compiled, checked simulator module, ready to be instantiated once per trial.
#[derive(Debug, Clone)]
pub struct SimulatorModule {
    engine: Engine,
    module: Module,
    sha256: String,
    metadata: Metadata,
}

/// The exports and their types (docs/simulators.md). `score` is checked only when the
/// metadata declares a score.
const EXPORTS: &[(&str, &str, &[ValType], &[ValType])] = &[
    ("plimsoll_sim_abi", "() -> i32", &[], &[ValType::I32]),
    ("metadata", "() -> i32", &[], &[ValType::I32]),
    ("buffer", "() -> i32", &[], &[ValType::I32]),
    ("init", "() -> i32", &[], &[ValType::I32]),
    ("step", "() -> i32", &[], &[ValType::I32]),
    ("state", "(i32) -> f64", &[ValType::I32], &[ValType::F64]),
    ("reason", "() -> i32", &[], &[ValType::I32]),
];

impl SimulatorModule {
    /// Reads and compiles the module at `path`.
    pub fn from_file(path: &std::path::Path) -> Result<Self, LoadSimulatorError> {
        Self::from_bytes(&read_module(path)?)
    }

    /// Compiles `bytes`, checks the exports, and reads and checks the metadata.
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
        // The exports' types now, so a wrong module fails before anything starts.
        for &(name, signature, params, results) in EXPORTS {
            export_type_is(&module, name, params, results).map_err(|detail| {
                LoadSimulatorError::Export {
                    name,
                    signature,
                    detail,
                }
            })?;
        }
        match module.get_export("memory") {
            Some(ty) if ty.memory().is_some() => {}
            Some(_) => {
                return Err(LoadSimulatorError::Export {
                    name: "memory",
                    signature: "a memory",
                    detail: "it is not a memory".into(),
                });
            }
            None => {
                return Err(LoadSimulatorError::Export {
                    name: "memory",
                    signature: "a memory",
                    detail: "no such export".into(),
                });
            }
        }
        let sha256 = hex::encode(Sha256::digest(bytes));
        let mut instance =
            Instantiated::new(&engine, &module).map_err(LoadSimulatorError::Running)?;
        let abi = instance
            .call("plimsoll_sim_abi", |s, e| e.abi.call(s, ()))
            .map_err(LoadSimulatorError::Running)?;
        if abi != ABI_VERSION {
            return Err(LoadSimulatorError::Abi(abi));
        }
        let at = instance
            .call("metadata", |s, e| e.metadata.call(s, ()))
            .map_err(LoadSimulatorError::Running)?;
        let text = instance
            .c_string(at, MAX_METADATA_BYTES + 1)
            .map_err(LoadSimulatorError::Running)?;
        if text.len() > MAX_METADATA_BYTES || !text.ends_with(&[0]) {
            return Err(LoadSimulatorError::Metadata(format!(
                "the text at `metadata()` has no NUL within {MAX_METADATA_BYTES} bytes"
            )));
        }
        let metadata =
            Metadata::parse(&text[..text.len() - 1]).map_err(LoadSimulatorError::Metadata)?;
        if metadata.score.is_some() {
            export_type_is(&module, "score", &[], &[ValType::F64]).map_err(|detail| {
                LoadSimulatorError::Export {
                    name: "score",
                    signature: "() -> f64 (its metadata declares a score)",
                    detail,
                }
            })?;
        }
        Ok(SimulatorModule {
            engine,
            module,
            sha256,
            metadata,
        })
    }

    /// Lowercase hex SHA-256 of the module's bytes.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// What the module says about itself.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// A fresh instance in its own store (fuel and memory limits set), not yet initialised.
    pub fn instantiate(&self) -> Result<Simulator, SimulatorError> {
        let mut inner = Instantiated::new(&self.engine, &self.module)?;
        let score = if self.metadata.score.is_some() {
            Some(
                inner
                    .instance
                    .get_typed_func(&mut inner.store, "score")
                    .map_err(|e| SimulatorError::Contract(e.to_string()))?,
            )
        } else {
            None
        };
        let at = inner.call("buffer", |s, e| e.buffer.call(s, ()))?;
        let len = self.metadata.buffer_len();
        let at = u32::try_from(at)
            .ok()
            .filter(|a| a % 8 == 0)
            .filter(|&a| {
                (a as usize).saturating_add(8 * len) <= inner.memory.data_size(&inner.store)
            })
            .ok_or_else(|| {
                SimulatorError::Contract(format!(
                    "buffer() returned {at}: it must be 8-byte aligned with room for {len} doubles inside the memory"
                ))
            })?;
        Ok(Simulator {
            inner,
            score,
            buffer: at as usize,
            state_len: self.metadata.state.len(),
        })
    }
}

/// Reads a module file, at most [`MAX_MODULE_BYTES`].
pub fn read_module(path: &std::path::Path) -> Result<Vec<u8>, LoadSimulatorError> {
    use std::io::Read as _;
    let read = |source| LoadSimulatorError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut bytes = Vec::new();
    file.take(MAX_MODULE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_MODULE_BYTES {
        return Err(LoadSimulatorError::TooLarge {
            path: path.to_owned(),
        });
    }
    Ok(bytes)
}

fn export_type_is(
    module: &Module,
    name: &str,
    params: &[ValType],
    results: &[ValType],
) -> Result<(), String> {
    let ty = module
        .get_export(name)
        .ok_or_else(|| "no such export".to_owned())?;
    let func = ty.func().ok_or_else(|| "it is not a function".to_owned())?;
    let same = |a: &mut dyn ExactSizeIterator<Item = ValType>, b: &[ValType]| {
        a.len() == b.len() && a.zip(b).all(|(x, y)| ValType::eq(&x, y))
    };
    if same(&mut func.params(), params) && same(&mut func.results(), results) {
        Ok(())
    } else {
        Err(format!("it is {func}"))
    }
}

struct Exports {
    abi: TypedFunc<(), i32>,
    metadata: TypedFunc<(), i32>,
    buffer: TypedFunc<(), i32>,
    init: TypedFunc<(), i32>,
    step: TypedFunc<(), i32>,
    state: TypedFunc<i32, f64>,
    reason: TypedFunc<(), i32>,
}

/// An instance with its store, exports and memory.
struct Instantiated {
    store: Store<StoreLimits>,
    instance: Instance,
    exports: Exports,
    memory: Memory,
}

impl Instantiated {
    fn new(engine: &Engine, module: &Module) -> Result<Self, SimulatorError> {
        let limits = StoreLimitsBuilder::new()
            .memory_size(MEMORY_LIMIT_BYTES)
            .memories(1)
            .tables(4)
            .table_elements(10_000)
            .instances(1)
            .trap_on_grow_failure(true)
            .build();
        let mut store = Store::new(engine, limits);
        store.limiter(|limits| limits);
        store
            .set_fuel(CALL_FUEL)
            .map_err(|e| SimulatorError::Instantiate(e.to_string()))?;
        let instance = Instance::new(&mut store, module, &[])
            .map_err(|e| classify(e, "start"))
            .map_err(|e| match e {
                SimulatorError::Trap { detail, .. } => SimulatorError::Instantiate(detail),
                other => other,
            })?;
        let contract = |e: wasmtime::Error| SimulatorError::Contract(e.to_string());
        let exports = Exports {
            abi: instance
                .get_typed_func(&mut store, "plimsoll_sim_abi")
                .map_err(contract)?,
            metadata: instance
                .get_typed_func(&mut store, "metadata")
                .map_err(contract)?,
            buffer: instance
                .get_typed_func(&mut store, "buffer")
                .map_err(contract)?,
            init: instance
                .get_typed_func(&mut store, "init")
                .map_err(contract)?,
            step: instance
                .get_typed_func(&mut store, "step")
                .map_err(contract)?,
            state: instance
                .get_typed_func(&mut store, "state")
                .map_err(contract)?,
            reason: instance
                .get_typed_func(&mut store, "reason")
                .map_err(contract)?,
        };
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| SimulatorError::Contract("no exported memory".into()))?;
        Ok(Instantiated {
            store,
            instance,
            exports,
            memory,
        })
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

    /// The bytes at `at` up to and including the first NUL, at most `limit` bytes (then
    /// without a NUL).
    fn c_string(&self, at: i32, limit: usize) -> Result<Vec<u8>, SimulatorError> {
        let data = self.memory.data(&self.store);
        let start = u32::try_from(at)
            .ok()
            .map(|a| a as usize)
            .filter(|&a| a < data.len())
            .ok_or_else(|| {
                SimulatorError::Contract(format!(
                    "address {at} is outside the memory ({} bytes)",
                    data.len()
                ))
            })?;
        let window = &data[start..data.len().min(start.saturating_add(limit))];
        Ok(match window.iter().position(|&b| b == 0) {
            Some(nul) => window[..=nul].to_vec(),
            None => window.to_vec(),
        })
    }
}

/// How one `step` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The trial goes on.
    Continue,
    /// The simulator failed the trial, for this reason.
    Failed(String),
    /// The simulator completed the trial early, for this reason.
    Completed(String),
}

/// One instance of a simulator: the state of one trial.
pub struct Simulator {
    inner: Instantiated,
    score: Option<TypedFunc<(), f64>>,
    buffer: usize,
    state_len: usize,
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator").finish_non_exhaustive()
    }
}

impl Simulator {
    /// Starts a trial from the scenario's initial values (in the metadata's order). `Ok(Err)`
    /// when the simulator refuses the scenario, with its reason.
    pub fn init(&mut self, initial: &[f64]) -> Result<Result<(), String>, SimulatorError> {
        self.write_buffer(initial)?;
        match self.inner.call("init", |s, e| e.init.call(s, ()))? {
            0 => Ok(Ok(())),
            _ => Ok(Err(self.reason()?)),
        }
    }

    /// One tick under `action` (already clamped to its bounds).
    pub fn step(&mut self, action: &[f64]) -> Result<Step, SimulatorError> {
        self.write_buffer(action)?;
        match self.inner.call("step", |s, e| e.step.call(s, ()))? {
            0 => Ok(Step::Continue),
            1 => Ok(Step::Failed(self.reason()?)),
            2 => Ok(Step::Completed(self.reason()?)),
            other => Err(SimulatorError::Contract(format!(
                "step() returned {other}; it must return 0 (go on), 1 (failed) or 2 (completed)"
            ))),
        }
    }

    /// The current state, every variable, into `out`; a non-finite value is a broken
    /// simulator.
    pub fn state(&mut self, out: &mut Vec<f64>) -> Result<(), SimulatorError> {
        out.clear();
        for i in 0..self.state_len {
            let v = self.inner.call("state", |s, e| e.state.call(s, i as i32))?;
            if !v.is_finite() {
                return Err(SimulatorError::Contract(format!(
                    "state({i}) is {v}; every state value must be finite"
                )));
            }
            out.push(v);
        }
        Ok(())
    }

    /// The score so far, when the simulator scores.
    pub fn score(&mut self) -> Result<Option<f64>, SimulatorError> {
        let Some(score) = self.score.clone() else {
            return Ok(None);
        };
        let v = self.inner.call("score", |s, _| score.call(s, ()))?;
        if !v.is_finite() {
            return Err(SimulatorError::Contract(format!(
                "score() is {v}; it must be finite"
            )));
        }
        Ok(Some(v))
    }

    fn reason(&mut self) -> Result<String, SimulatorError> {
        let at = self.inner.call("reason", |s, e| e.reason.call(s, ()))?;
        let mut text = self.inner.c_string(at, MAX_REASON_BYTES)?;
        if text.last() == Some(&0) {
            text.pop();
        }
        match String::from_utf8(text) {
            Ok(s) => Ok(s),
            // Cut inside a character by the byte limit: keep the whole characters.
            Err(e) if e.utf8_error().error_len().is_none() => {
                let valid = e.utf8_error().valid_up_to();
                let mut bytes = e.into_bytes();
                bytes.truncate(valid);
                Ok(String::from_utf8(bytes).expect("valid up to here"))
            }
            Err(_) => Err(SimulatorError::Contract(
                "reason() points at text that is not UTF-8".into(),
            )),
        }
    }

    fn write_buffer(&mut self, values: &[f64]) -> Result<(), SimulatorError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.inner
            .memory
            .write(&mut self.inner.store, self.buffer, &bytes)
            .map_err(|e| SimulatorError::Contract(format!("cannot write buffer(): {e}")))
    }

    /// Fuel left after the last call.
    fn fuel_left(&self) -> u64 {
        self.inner.store.get_fuel().unwrap_or(0)
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

/// Clamps each action value to its bounds.
pub fn clamp(metadata: &Metadata, action: &[f64], out: &mut Vec<f64>) {
    out.clear();
    out.extend(
        action
            .iter()
            .zip(&metadata.action)
            .map(|(v, a)| v.clamp(a.min, a.max)),
    );
}

/// What `--bench-sim` measured.
#[derive(Debug, Clone, Copy)]
pub struct SimBench {
    /// Steps run.
    pub steps: u64,
    /// Wall time of the steps (reading the state after each included).
    pub seconds: f64,
    /// Fuel one step used (the first).
    pub fuel_per_step: u64,
}

/// Runs `steps` steps of a fresh instance from `initial`, the action held at the middle of
/// each bound, the state read after each step as a trial does; a trial that ends starts
/// again from `initial`.
pub fn bench(
    module: &SimulatorModule,
    initial: &[f64],
    steps: u64,
) -> Result<SimBench, SimulatorError> {
    let mut sim = module.instantiate()?;
    let start = |sim: &mut Simulator| {
        sim.init(initial)?
            .map_err(|r| SimulatorError::Contract(format!("init refused the scenario: {r}")))
    };
    let action: Vec<f64> = module
        .metadata()
        .action
        .iter()
        .map(|a| a.min / 2.0 + a.max / 2.0)
        .collect();
    start(&mut sim)?;
    sim.step(&action)?;
    let fuel_per_step = CALL_FUEL - sim.fuel_left();
    start(&mut sim)?;
    let mut state = Vec::new();
    let started = Instant::now();
    for _ in 0..steps {
        if sim.step(&action)? != Step::Continue {
            start(&mut sim)?;
        }
        sim.state(&mut state)?;
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

    const META: &str = r#"{"abi": 1, "name": "counter", "version": "1.0.0", "ticks_per_second": 10, "state": [{"name": "x", "unit": "m"}], "action": [{"name": "push", "unit": "m", "min": -1, "max": 2}], "initial": [{"name": "x", "unit": "m"}]}"#;
    const STEP: &str = "(global.set $x (f64.add (global.get $x) (f64.load (i32.const 8192)))) \
        (if (result i32) (f64.gt (global.get $x) (f64.const 10)) (then (i32.const 1)) (else (i32.const 0)))";
    const INIT: &str = "(global.set $x (f64.load (i32.const 8192))) \
        (if (result i32) (f64.lt (global.get $x) (f64.const 0)) (then (i32.const 1)) (else (i32.const 0)))";

    /// A small simulator in the text format: `x` moves by the action; it fails above 10, and
    /// init refuses a negative start. Each part can be replaced to make a broken one.
    struct Wat<'a> {
        imports: &'a str,
        meta: &'a str,
        abi: &'a str,
        init: &'a str,
        step: &'a str,
        state: &'a str,
        buffer: &'a str,
        reason: &'a str,
        extra: &'a str,
        pages: u32,
        meta_at: &'a str,
    }

    impl Default for Wat<'_> {
        fn default() -> Self {
            Wat {
                imports: "",
                meta: META,
                abi: "(i32.const 1)",
                init: INIT,
                step: STEP,
                state: "(global.get $x)",
                buffer: "(i32.const 8192)",
                reason: r#"(func (export "reason") (result i32) (i32.const 4096))"#,
                extra: "",
                pages: 1,
                meta_at: "(i32.const 1024)",
            }
        }
    }

    impl Wat<'_> {
        fn bytes(&self) -> Vec<u8> {
            let meta = self.meta.replace('\\', "\\\\").replace('"', "\\\"");
            let text = format!(
                r#"(module {imports}
                  (memory (export "memory") {pages})
                  (data (i32.const 1024) "{meta}\00")
                  (data (i32.const 4096) "too high\00")
                  (global $x (mut f64) (f64.const 0))
                  (func (export "plimsoll_sim_abi") (result i32) {abi})
                  (func (export "metadata") (result i32) {meta_at})
                  (func (export "buffer") (result i32) {buffer})
                  (func (export "init") (result i32) {init})
                  (func (export "step") (result i32) {step})
                  (func (export "state") (param i32) (result f64) {state})
                  {reason} {extra})"#,
                imports = self.imports,
                abi = self.abi,
                buffer = self.buffer,
                init = self.init,
                step = self.step,
                state = self.state,
                reason = self.reason,
                extra = self.extra,
                pages = self.pages,
                meta_at = self.meta_at,
            );
            wat::parse_str(text).expect("valid text format")
        }

        fn load(&self) -> Result<SimulatorModule, LoadSimulatorError> {
            SimulatorModule::from_bytes(&self.bytes())
        }
    }

    fn started(w: &Wat<'_>) -> Simulator {
        let mut sim = w.load().unwrap().instantiate().unwrap();
        sim.init(&[0.0]).unwrap().unwrap();
        sim
    }

    #[test]
    fn a_module_of_the_abi_loads_runs_and_fails_with_its_reason() {
        let m = Wat::default().load().unwrap();
        assert_eq!(m.metadata().name, "counter");
        assert_eq!(m.metadata().action[0].max, 2.0);
        assert_eq!(m.sha256().len(), 64);
        let mut sim = m.instantiate().unwrap();
        assert_eq!(
            sim.init(&[-1.0]).unwrap(),
            Err("too high".into()),
            "init refuses a negative start (its reason text is shared here)"
        );
        sim.init(&[9.0]).unwrap().unwrap();
        let mut state = Vec::new();
        sim.state(&mut state).unwrap();
        assert_eq!(state, [9.0]);
        assert_eq!(sim.step(&[0.5]).unwrap(), Step::Continue);
        assert_eq!(sim.step(&[1.0]).unwrap(), Step::Failed("too high".into()));
        sim.state(&mut state).unwrap();
        assert_eq!(state, [10.5]);
        assert_eq!(sim.score().unwrap(), None);
        let mut clamped = Vec::new();
        clamp(m.metadata(), &[5.0], &mut clamped);
        assert_eq!(clamped, [2.0]);
        clamp(m.metadata(), &[-5.0], &mut clamped);
        assert_eq!(clamped, [-1.0]);
    }

    #[test]
    fn a_module_that_imports_anything_is_refused() {
        let e = Wat {
            imports: r#"(import "env" "clock" (func $clock (result f64)))"#,
            ..Wat::default()
        }
        .load()
        .unwrap_err();
        assert!(
            matches!(e, LoadSimulatorError::Imports(ref i) if i.contains("env.clock")),
            "{e}"
        );
    }

    #[test]
    fn a_missing_or_mistyped_export_or_another_abi_is_refused() {
        let e = Wat {
            reason: "",
            ..Wat::default()
        }
        .load()
        .unwrap_err();
        assert!(
            matches!(e, LoadSimulatorError::Export { name: "reason", .. }),
            "{e}"
        );
        let e = Wat {
            state: "(drop (local.get 0)) (f64.const 1)",
            extra: r#"(func (export "step2") (result f64) (f64.const 0))"#,
            ..Wat::default()
        }
        .load();
        assert!(e.is_ok(), "an extra export is fine");
        let text = Wat::default();
        let mistyped = Wat {
            reason: r#"(func (export "reason") (result i64) (i64.const 4096))"#,
            ..text
        };
        let e = mistyped.load().unwrap_err();
        assert!(e.to_string().contains("`reason` as () -> i32"), "{e}");
        let e = Wat {
            abi: "(i32.const 2)",
            ..Wat::default()
        }
        .load()
        .unwrap_err();
        assert!(matches!(e, LoadSimulatorError::Abi(2)), "{e}");
        // A score declared but not exported.
        let meta = META.replace(
            r#""initial""#,
            r#""score": {"name": "s", "unit": ""}, "initial""#,
        );
        let e = Wat {
            meta: &meta,
            ..Wat::default()
        }
        .load()
        .unwrap_err();
        assert!(
            matches!(e, LoadSimulatorError::Export { name: "score", .. }),
            "{e}"
        );
    }

    #[test]
    fn bad_metadata_is_refused_with_what_is_wrong() {
        for (meta, want) in [
            ("not json", "expected"),
            (
                &META.replace(r#""name": "counter""#, r#""name": "Counter""#),
                "does not match",
            ),
            (&META.replace(r#""min": -1"#, r#""min": 3"#), "min < max"),
            (
                &META.replace(r#""state": [{"name": "x", "unit": "m"}]"#, r#""state": []"#),
                "state has 0 variables",
            ),
            (
                &META.replace(
                    r#""state": [{"name": "x", "unit": "m"}]"#,
                    r#""state": [{"name": "x", "unit": "m"}, {"name": "x", "unit": "s"}]"#,
                ),
                "listed twice",
            ),
            (
                &META.replace(r#""abi": 1,"#, r#""abi": 1, "seed": 4,"#),
                "unknown field `seed`",
            ),
            (
                &META.replace(r#""ticks_per_second": 10"#, r#""ticks_per_second": 0"#),
                "ticks_per_second",
            ),
            (
                &META.replace(
                    r#""unit": "m"}]"#,
                    r#""unit": "metres per second squared"}]"#,
                ),
                "unit",
            ),
        ] {
            let e = Wat {
                meta,
                ..Wat::default()
            }
            .load()
            .unwrap_err();
            assert!(
                matches!(e, LoadSimulatorError::Metadata(ref m) if m.contains(want)),
                "{meta}: {e}"
            );
        }
        // Metadata with no NUL before the end of the memory.
        let e = Wat {
            meta_at: "(i32.const 65530)",
            extra: r#"(data (i32.const 65530) "{{{{{{")"#,
            ..Wat::default()
        }
        .load()
        .unwrap_err();
        assert!(e.to_string().contains("has no NUL"), "{e}");
        // And at an address outside the memory.
        let e = Wat {
            meta_at: "(i32.const -8)",
            ..Wat::default()
        }
        .load()
        .unwrap_err();
        assert!(e.to_string().contains("outside the memory"), "{e}");
    }

    #[test]
    fn a_trap_a_loop_or_a_memory_grab_ends_with_the_simulators_failure() {
        let mut sim = started(&Wat {
            step: "unreachable",
            ..Wat::default()
        });
        let e = sim.step(&[0.0]).unwrap_err();
        assert!(
            matches!(e, SimulatorError::Trap { call: "step", .. }),
            "{e}"
        );

        let mut sim = started(&Wat {
            step: "(loop $l (br $l)) (i32.const 0)",
            ..Wat::default()
        });
        let e = sim.step(&[0.0]).unwrap_err();
        assert!(
            matches!(e, SimulatorError::OutOfFuel { call: "step" }),
            "{e}"
        );

        // 1,000 pages is 64 MiB, past the 16 MiB limit: the grow traps.
        let mut sim = started(&Wat {
            step: "(drop (memory.grow (i32.const 1000))) (i32.const 0)",
            ..Wat::default()
        });
        let e = sim.step(&[0.0]).unwrap_err();
        assert!(
            matches!(e, SimulatorError::Trap { call: "step", .. }),
            "{e}"
        );

        // A module whose memory starts past the limit (300 pages, 19 MiB) does not
        // instantiate.
        let e = Wat {
            pages: 300,
            ..Wat::default()
        }
        .load()
        .unwrap_err();
        assert!(
            matches!(
                e,
                LoadSimulatorError::Running(SimulatorError::Instantiate(_))
            ),
            "{e}"
        );
    }

    /// A reason is read up to 200 bytes, cut at a character boundary, never refused for its
    /// length.
    #[test]
    fn a_long_reason_is_cut_at_a_character_boundary() {
        // 201 bytes: "x" then 100 two-byte characters; the cut at 200 falls inside the last.
        let text = format!("x{}", "\\c3\\a9".repeat(100));
        let reason = format!(
            r#"(func (export "reason") (result i32) (i32.const 5000)) (data (i32.const 5000) "{text}\00")"#
        );
        let mut sim = started(&Wat {
            step: "(i32.const 1)",
            reason: &reason,
            ..Wat::default()
        });
        let Step::Failed(why) = sim.step(&[0.0]).unwrap() else {
            panic!("the step fails");
        };
        assert_eq!(why, format!("x{}", "\u{e9}".repeat(99)));
        assert_eq!(why.len(), 199);
    }

    #[test]
    fn broken_answers_are_the_simulators_fault() {
        let mut sim = started(&Wat {
            step: "(i32.const 7)",
            ..Wat::default()
        });
        let e = sim.step(&[0.0]).unwrap_err();
        assert!(e.to_string().contains("returned 7"), "{e}");

        let mut sim = started(&Wat {
            state: "(f64.const nan)",
            ..Wat::default()
        });
        let e = sim.state(&mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("must be finite"), "{e}");

        let e = Wat {
            buffer: "(i32.const 8193)",
            ..Wat::default()
        }
        .load()
        .unwrap()
        .instantiate()
        .unwrap_err();
        assert!(e.to_string().contains("8-byte aligned"), "{e}");

        let e = Wat {
            buffer: "(i32.const 65536)",
            ..Wat::default()
        }
        .load()
        .unwrap()
        .instantiate()
        .unwrap_err();
        assert!(e.to_string().contains("inside the memory"), "{e}");

        let meta = META.replace(
            r#""initial""#,
            r#""score": {"name": "s", "unit": ""}, "initial""#,
        );
        let mut sim = started(&Wat {
            meta: &meta,
            extra: r#"(func (export "score") (result f64) (f64.const inf))"#,
            ..Wat::default()
        });
        let e = sim.score().unwrap_err();
        assert!(e.to_string().contains("score() is inf"), "{e}");

        let mut sim = started(&Wat {
            step: "(i32.const 1)",
            reason: r#"(func (export "reason") (result i32) (i32.const 5000)) (data (i32.const 5000) "\ff\fe\00")"#,
            ..Wat::default()
        });
        let e = sim.step(&[0.0]).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }
}
