//! The egress tests' servers: `scripts/egress-fixture` (pypiserver over TLS, a static npm
//! registry, an HTTPS file server with `/hello.txt`, `/big`, `/redirect` and `/slow`, and a
//! plain-HTTP one), all on 127.0.0.1 behind the test CA of tests/fixtures/egress, started for
//! one test and gone when it is dropped (its stdin closes).

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::workspace_root;

/// The running fixture: its ports and files.
#[derive(Debug)]
pub struct EgressFixture {
    child: Child,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
    /// What it said at start: ports, the CA, the wheel, the tarball, the big file.
    pub info: serde_json::Value,
}

impl EgressFixture {
    /// Starts the fixture serving from `dir` (created).
    pub fn start(dir: &Path) -> Result<EgressFixture, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let script = workspace_root().join("scripts/egress-fixture");
        #[expect(
            clippy::disallowed_methods,
            reason = "test support starts the fixture server"
        )]
        let mut child = Command::new(&script)
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", script.display()))?;
        let stdin = child.stdin.take();
        let mut line = String::new();
        let out = child.stdout.take().expect("piped");
        BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| format!("the egress fixture said nothing: {e}"))?;
        let info: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| format!("the egress fixture said {line:?}, not its ports: {e}"))?;
        Ok(EgressFixture {
            child,
            stdin,
            dir: dir.to_owned(),
            info,
        })
    }

    /// The port of `server`: `pypi`, `registry`, `files` or `plain`.
    pub fn port(&self, server: &str) -> u16 {
        self.info[server]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| panic!("the fixture names no {server} port: {}", self.info))
    }

    /// The test CA's certificate (PEM).
    pub fn ca_pem(&self) -> String {
        let path = self.info["ca"].as_str().expect("the fixture names its CA");
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// TCP connections each server accepted so far.
    pub fn connections(&self, server: &str) -> u64 {
        let path = self.dir.join("connections.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display()));
        v[server].as_u64().unwrap_or(0)
    }
}

impl Drop for EgressFixture {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
