//! A plimsolld of the oracle's own, as a child process: a loopback port, a fresh state
//! directory and callers file, the providers to try, its log in a file; stopped (SIGTERM,
//! then SIGKILL) when dropped, and sent SIGTERM by the kernel if the oracle dies first.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use plimsoll_client::{Client, Token};
use plimsoll_daemon::testing::uid_base_for_port;

/// How long plimsolld may take to bind its port.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long its providers' probes may take (a QEMU guest booting under TCG is the slowest).
const READY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long it may take to stop after SIGTERM (runs in flight finish first).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// The line the daemon logs when it could not offer any provider.
const NONE_PASSED: &str = "no provider passed its probe";

/// What the oracle's daemon offers.
#[derive(Debug, Clone)]
pub struct DaemonPlan {
    /// The plimsolld binary.
    pub plimsolld: PathBuf,
    /// Providers to configure (the probe withdraws the ones this host cannot run).
    pub providers: Vec<String>,
    /// Where its log (JSON lines, stderr) goes.
    pub log: PathBuf,
}

/// A running plimsolld child.
#[derive(Debug)]
pub struct LocalDaemon {
    child: Child,
    /// Its base URL, e.g. `http://127.0.0.1:40123`.
    pub url: String,
    /// A caller token it accepts (caller `oracle`).
    pub token: Token,
    log: PathBuf,
    // Held while the daemon lives: its port number picks a sandbox uid range no other daemon
    // started this way uses (the end of a run kills every process of its uids).
    _uid_port: TcpListener,
    // Last: the state directory and callers file outlive the child.
    _dir: tempfile::TempDir,
}

/// The TOML settings of the oracle's daemon.
pub fn settings_toml(
    providers: &[String],
    state: &Path,
    callers: &Path,
    sandbox_uid_base: u32,
) -> String {
    let list = providers
        .iter()
        .map(|p| format!("{p:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    // Runs go one at a time; two slots leave room for a probe re-check beside a run. The
    // OCI runtimes' state lives in the daemon's own state directory: two oracle daemons at
    // once (the tests) never touch each other's containers.
    format!(
        "providers = [{list}]\ndefault_floor = \"container\"\nstate_dir = {:?}\n\
         sandbox_uid_base = {sandbox_uid_base}\nmax_concurrent = 2\nmax_per_caller = 2\n\n\
         [oci]\nstate_root = {:?}\n\n\
         [daemon]\ncallers_file = {:?}\n",
        state.display().to_string(),
        state.join("oci").display().to_string(),
        callers.display().to_string()
    )
}

impl LocalDaemon {
    /// Writes the settings and callers file, starts plimsolld on a loopback port and waits
    /// until it listens. Call [`LocalDaemon::wait_probed`] before asking for providers.
    pub fn start(plan: &DaemonPlan) -> anyhow::Result<LocalDaemon> {
        if !plan.plimsolld.is_file() {
            bail!(
                "no plimsolld at {}: build it (`cargo build --workspace`), or pass --plimsolld PATH",
                plan.plimsolld.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("plimsoll-oracle-")
            .tempdir()
            .context("cannot create a directory for the daemon's state")?;
        // Sandbox uids must traverse it to reach their run directories under `state`.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .context("cannot make the daemon's directory traversable")?;
        let state = dir.path().join("state");
        std::fs::create_dir(&state).context("cannot create the daemon's state directory")?;
        let callers = dir.path().join("callers.toml");
        let token = plimsoll_callers::add_caller(&callers, "oracle")
            .context("cannot write the daemon's callers file")?;
        let uid_port = TcpListener::bind("127.0.0.1:0")
            .context("cannot bind a loopback port (it picks the daemon's uid range)")?;
        let uid_base = uid_base_for_port(uid_port.local_addr()?.port());
        let config = dir.path().join("plimsoll.toml");
        std::fs::write(
            &config,
            settings_toml(&plan.providers, &state, &callers, uid_base),
        )
        .context("cannot write the daemon's settings")?;

        if let Some(parent) = plan.log.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let log = File::create(&plan.log)
            .with_context(|| format!("cannot create {}", plan.log.display()))?;
        #[expect(
            clippy::disallowed_methods,
            reason = "the oracle starts the plimsolld binary as an operator would, not a sandboxed child"
        )]
        let mut command = Command::new(&plan.plimsolld);
        command
            .arg("--config")
            .arg(&config)
            .args(["--listen", "127.0.0.1:0"])
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("PLIMSOLL_LOG", "info")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // The daemon ends with this program.
        plimsoll_sys::exec::PreExec::new()
            .unnamed(plimsoll_sys::exec::Step::ParentDeathSignal(
                rustix::process::Signal::TERM,
            ))
            .install_untracked(&mut command);
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {}", plan.plimsolld.display()))?;
        let mut daemon = LocalDaemon {
            child,
            url: String::new(),
            token,
            log: plan.log.clone(),
            _uid_port: uid_port,
            _dir: dir,
        };
        let addr = daemon.wait_for_log(LISTEN_TIMEOUT, |line| {
            let v: serde_json::Value = serde_json::from_str(line).ok()?;
            (v["message"] == "listening")
                .then(|| v["addr"].as_str().map(str::to_owned))
                .flatten()
        })?;
        daemon.url = format!("http://{addr}");
        Ok(daemon)
    }

    /// A client of this daemon.
    pub fn client(&self) -> Client {
        Client::new(self.url.clone(), self.token.clone())
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Waits until every provider has been probed: `/readyz` says ready, or the log says none
    /// passed (the providers list then says why).
    pub fn wait_probed(&mut self) -> anyhow::Result<()> {
        let client = self.client();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if client.is_ready() {
                return Ok(());
            }
            self.check_alive()?;
            if self.log_text().contains(NONE_PASSED) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "plimsolld probed its providers for more than {} s without finishing; see {}",
                    READY_TIMEOUT.as_secs(),
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "plimsolld exited ({status}) before it was ready; the end of its log ({}):\n{}",
                self.log.display(),
                tail(&self.log_text(), 20)
            );
        }
        Ok(())
    }

    /// Polls the log until `find` recognises a line.
    fn wait_for_log<T>(
        &mut self,
        timeout: Duration,
        find: impl Fn(&str) -> Option<T>,
    ) -> anyhow::Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.log_text().lines().find_map(&find) {
                return Ok(found);
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "plimsolld did not start listening within {} s; see {}",
                    timeout.as_secs(),
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for LocalDaemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait()
            && let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!(
                "plimsoll-example-oracle: plimsolld did not stop within {} s of SIGTERM; killing it",
                STOP_TIMEOUT.as_secs()
            );
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_parse_as_the_daemon_reads_them() {
        let s = settings_toml(
            &["crun".into(), "qemu".into()],
            Path::new("/tmp/x \"y\"/state"),
            Path::new("/tmp/x/callers.toml"),
            1_000_000_000,
        );
        let parsed = plimsoll_engine::settings::Settings::parse(&s).unwrap();
        assert_eq!(
            parsed.providers.as_deref(),
            Some(&["crun".to_owned(), "qemu".to_owned()][..])
        );
        assert_eq!(
            parsed.state_dir.as_deref(),
            Some(Path::new("/tmp/x \"y\"/state"))
        );
        assert_eq!(parsed.sandbox_uid_base, Some(1_000_000_000));
        assert_eq!(
            parsed.daemon.callers_file.as_deref(),
            Some(Path::new("/tmp/x/callers.toml"))
        );
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
