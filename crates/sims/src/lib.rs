//! The simulators shipped with plimsoll (sims/: the cart-pole, the water tank, the DC motor),
//! each a plimsoll-sim/1 WebAssembly module (docs/simulators.md) built by build.rs through
//! scripts/build-sim, with the directory of its scenarios. For tests and examples: the trial
//! runner takes a simulator as a file like any exam author's.

use std::path::{Path, PathBuf};

/// One simulator under sims/.
#[derive(Debug)]
pub struct Shipped {
    /// The directory's name under sims/, which is also the name its metadata declares.
    pub name: &'static str,
    /// The module, as scripts/build-sim built it.
    pub wasm: &'static [u8],
    /// sims/NAME/scenarios in the source tree.
    pub scenario_dir: &'static str,
}

/// Every simulator under sims/, by name.
pub const SHIPPED: &[Shipped] = include!(concat!(env!("OUT_DIR"), "/shipped.rs"));

/// The shipped simulator called `name`.
pub fn get(name: &str) -> Option<&'static Shipped> {
    SHIPPED.iter().find(|s| s.name == name)
}

impl Shipped {
    /// The simulator's scenario files (`*.json` in its scenario directory), by name.
    pub fn scenarios(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(self.scenario_dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|ext| ext == "json") {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }

    /// The scenario `name.json` of this simulator (which may not exist).
    pub fn scenario(&self, name: &str) -> PathBuf {
        Path::new(self.scenario_dir).join(format!("{name}.json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmparser::types::EntityType;
    use wasmparser::{ValType, Validator};

    /// The functions plimsoll-sim/1 requires: name, parameters, results.
    const FUNCTIONS: &[(&str, &[ValType], &[ValType])] = &[
        ("plimsoll_sim_abi", &[], &[ValType::I32]),
        ("metadata", &[], &[ValType::I32]),
        ("buffer", &[], &[ValType::I32]),
        ("init", &[], &[ValType::I32]),
        ("step", &[], &[ValType::I32]),
        ("state", &[ValType::I32], &[ValType::F64]),
        ("reason", &[], &[ValType::I32]),
    ];

    #[test]
    fn the_three_simulators_are_shipped_in_name_order() {
        let names: Vec<_> = SHIPPED.iter().map(|s| s.name).collect();
        assert_eq!(names, ["cartpole", "motor", "tank"]);
        assert!(get("tank").is_some());
        assert!(get("boat").is_none());
    }

    #[test]
    fn every_module_is_valid_imports_nothing_and_has_the_abi_exports() {
        for sim in SHIPPED {
            let types = Validator::new()
                .validate_all(sim.wasm)
                .unwrap_or_else(|e| panic!("{}: not valid WebAssembly: {e}", sim.name));
            let types = types.as_ref();
            let imports: Vec<_> = types
                .core_imports()
                .expect("a module")
                .map(|(m, n, _)| format!("{m}.{n}"))
                .collect();
            assert!(imports.is_empty(), "{}: imports {imports:?}", sim.name);

            let exports: Vec<_> = types.core_exports().expect("a module").collect();
            let function = |name: &str| {
                exports
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, t)| match t {
                        EntityType::Func(id) => {
                            let f = types[*id].unwrap_func();
                            (f.params().to_vec(), f.results().to_vec())
                        }
                        other => panic!("{}: export {name} is not a function: {other:?}", sim.name),
                    })
            };
            for (name, params, results) in FUNCTIONS {
                let found =
                    function(name).unwrap_or_else(|| panic!("{}: no export {name}", sim.name));
                assert_eq!(
                    found,
                    (params.to_vec(), results.to_vec()),
                    "{}: {name}",
                    sim.name
                );
            }
            if let Some(found) = function("score") {
                assert_eq!(found, (vec![], vec![ValType::F64]), "{}: score", sim.name);
            }
            assert!(
                exports
                    .iter()
                    .any(|(n, t)| *n == "memory" && matches!(t, EntityType::Memory(_))),
                "{}: no exported memory",
                sim.name
            );
        }
    }

    #[test]
    fn every_simulator_has_a_standard_scenario_and_every_scenario_is_json() {
        for sim in SHIPPED {
            let files = sim.scenarios().expect("the scenario directory");
            assert!(
                files.contains(&sim.scenario("standard")),
                "{}: no standard.json",
                sim.name
            );
            for file in files {
                let text = std::fs::read_to_string(&file).expect("a scenario");
                let value: serde_json::Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                assert!(
                    value["initial"].is_object(),
                    "{}: no initial object",
                    file.display()
                );
                assert!(value["ticks"].is_u64(), "{}: no ticks", file.display());
                assert!(
                    value["pass_ticks"].is_u64(),
                    "{}: no pass_ticks",
                    file.display()
                );
            }
        }
    }
}
