//! The command line, as clap parses it. Nothing here acts.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand};
use plimsoll_wire::{Language, Tier};

/// Exit statuses, as `run --help` and docs/cli.md describe them.
pub const EXIT_STATUSES: &str = "\
Exit status:
  0  the run happened (whatever the program's own exit code, which the header and --json show)
  1  another command failed (providers, callers, bench); run: an artifact was not written to --out
  2  usage: bad arguments, an unreadable file, no token, invalid settings; nothing was sent
  3  not dispatched: refused before anything ran (`not dispatched (REASON): ...`)
  4  the code may have run, but no verified result came back: do not retry blindly";

/// plimsoll runs untrusted code in a sandbox and says how strong that sandbox was.
///
/// Without --daemon (or PLIMSOLL_DAEMON) commands use an embedded engine in this process,
/// offering every provider this build has; with it they talk to plimsolld.
#[derive(Debug, Parser)]
#[command(name = "plimsoll", version, after_help = after_help())]
pub struct Cli {
    /// Settings file (TOML) for the embedded engine and `callers add`.
    /// Default: PLIMSOLL_CONFIG, else /etc/plimsoll/plimsoll.toml if it exists.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print no notes or progress on stderr (errors, data and a run's own output still).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

fn after_help() -> String {
    format!("{EXIT_STATUSES}\n\n{}", plimsoll_env::help_text())
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a JavaScript or Python snippet, a project (--file, --step, --artifact) or a whole
    /// request (--request), and print its output, tier and provider.
    #[command(after_help = after_help())]
    Run(Box<RunArgs>),
    /// Examine a controller against a simulator its image carries, on hidden scenarios: a
    /// project run of one trial step (docs/simulators.md); the record names the simulator,
    /// how each trial ended and its score.
    #[command(after_help = TRIAL_AFTER_HELP)]
    Trial(Box<TrialArgs>),
    /// Write the report page of two trials (docs/trials.md, "The report"): each from a run's
    /// JSON answer (`plimsoll trial --json`, `plimsoll run --json`), replayed side by side.
    Report(ReportArgs),
    /// List providers: tier, availability, and the evidence behind it.
    Providers(ProvidersArgs),
    /// Keep one sandbox across calls on a daemon: open a session, run cells in its
    /// interpreter (state kept), shell steps, put and get files, close it (docs/sessions.md).
    #[command(subcommand)]
    Session(SessionCommand),
    /// The images runs may name (docs/images.md): list, show, import, remove.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Manage the callers of a daemon.
    #[command(subcommand)]
    Callers(CallersCommand),
    /// Measure start-up: median and p90 of a trivial snippet per provider, through the
    /// embedded engine and through a plimsolld it starts, beside bare node and python3.
    Bench(BenchArgs),
    /// Set this host up for plimsolld: probe every provider, write the settings file listing
    /// those that passed, create the state and callers directories, add a first caller.
    Init(InitArgs),
    /// Say which tiers this host can offer now and what each missing one would take. Exit
    /// status 0 when the default floor can be served, 1 when it cannot.
    Doctor(DoctorArgs),
    /// Print a shell completion script for plimsoll on stdout.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages of plimsoll and its subcommands (plimsoll.1, plimsoll-run.1, ...)
    /// into DIR.
    Man {
        /// The directory to write them into (created if missing).
        dir: PathBuf,
    },
    /// Serve the MCP tools (run_code, run_project, list_providers, and the session tools) on
    /// stdin/stdout, for agent apps; see docs/mcp.md.
    Mcp(crate::mcp::McpArgs),
}

/// `plimsoll run`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["code", "file", "steps", "request"])))]
pub struct RunArgs {
    /// The code to run (JavaScript unless --lang says otherwise).
    #[arg(short = 'e', long = "eval", value_name = "CODE")]
    pub code: Option<String>,
    /// A file to run; `-` reads standard input. The language comes from the extension
    /// (.js .mjs .cjs, .py) unless --lang is given.
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The language: javascript (js) or python (py).
    #[arg(long, value_name = "LANG", value_parser = parse_language, conflicts_with_all = ["steps", "request"])]
    pub lang: Option<Language>,
    /// A project's shell step, run by `/bin/sh -c` in /work; repeat for more, run in order
    /// (the first that fails stops the run). Makes the run a project.
    #[arg(long = "step", value_name = "CMD")]
    pub steps: Vec<String>,
    /// A file for the project: the local PATH, written as NAME under /work (default: PATH's
    /// file name); the executable bit is kept. Repeat for more.
    #[arg(long = "file", value_name = "PATH[=NAME]", requires = "steps")]
    pub project_files: Vec<String>,
    /// A path under /work to return after the steps; repeat for more. Written to --out DIR
    /// when given.
    #[arg(long = "artifact", value_name = "PATH", requires = "steps")]
    pub artifacts: Vec<String>,
    /// Write the returned artifacts under this directory, byte for byte (created if
    /// missing); an artifact whose name would leave it is refused.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Send this whole run request (JSON, docs/protocol.md); `-` reads standard input.
    /// Its `request_id` (optional) is replaced by a fresh one, and `protocol` may be left out.
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["min_isolation", "provider", "image", "timeout_ms", "grant"])]
    pub request: Option<PathBuf>,
    /// The floor: the weakest tier to accept (process, container, kernel, vm). Default: the
    /// settings' default_floor, `container` unless configured.
    #[arg(long, value_name = "TIER", value_parser = parse_tier)]
    pub min_isolation: Option<Tier>,
    /// Run on this provider only (it must still meet the floor).
    #[arg(long, value_name = "NAME")]
    pub provider: Option<String>,
    /// Run in this image: a name or an identity (sha256:...); `plimsoll image list` lists
    /// them. Default: the operator's default image. Never served by another.
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// Wall-clock timeout in milliseconds.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: Option<u64>,
    /// Send the run to this daemon (token from PLIMSOLL_TOKEN). Default: PLIMSOLL_DAEMON,
    /// else the embedded engine.
    #[arg(long, value_name = "URL")]
    pub daemon: Option<String>,
    /// Print the whole response (or the error object) as JSON on stdout; a response also
    /// holds the request as sent and, from the embedded engine, the evidence it ran on.
    #[arg(long)]
    pub json: bool,
    /// Write the run's output as it is printed (a snippet at process, crun, runc and runsc),
    /// then the header; through a daemon, interrupting this command cancels the run.
    #[arg(long, conflicts_with = "json")]
    pub stream: bool,
    /// Run with this grant profile: an API grant lets the code call that API through the
    /// broker (`host.get(...)` in JavaScript, `plimsoll_host` in Python), an egress grant lets
    /// it reach the hosts the profile lists (HTTPS_PROXY); see docs/capability-grants.md. Each
    /// call and connection attempt is printed after the header.
    #[arg(long, value_name = "PROFILE")]
    pub grant: Option<String>,
    /// Grant profiles for the embedded engine (TOML, docs/capability-grants.md); the secrets
    /// it names are read from this environment, and runs are by caller `local`. A daemon's
    /// grants are its operator's.
    #[arg(long, value_name = "FILE", conflicts_with = "daemon")]
    pub grants: Option<PathBuf>,
    /// Set by `plimsoll trial`: the exit status says whether every trial passed.
    #[arg(skip)]
    pub trial: bool,
    /// Set by `plimsoll trial`: the project to run, built by the client's `TrialOptions`.
    #[arg(skip)]
    pub project: Option<plimsoll_wire::Project>,
}

const TRIAL_AFTER_HELP: &str = "\
Each scenario file is sent with the run and deleted by the trial runner before the controller
starts, so the controller never sees it. The trajectories come back as artifacts (--out DIR).

Example:
  plimsoll trial --simulator tank --scenario hidden-1.json --scenario hidden-2.json \\
      --controller controller.py --out results/

Exit status: 0 every trial passed; 1 a trial failed or the run failed; 2 usage; 3 not
dispatched (the refusal says why); 4 may have run (the connection was lost).";

/// `plimsoll report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The first run's JSON answer, as `plimsoll trial --json` printed it (the reference run,
    /// e.g. the accepted controller's).
    #[arg(value_name = "FIRST.json")]
    pub first: PathBuf,
    /// The second run's (e.g. a draft's), of the same simulator.
    #[arg(value_name = "SECOND.json")]
    pub second: PathBuf,
    /// Which trial of each run's trial step to show, from 1 (its scenarios' order).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub trial: u64,
    /// Where to write the page.
    #[arg(long, value_name = "FILE", default_value = "report.html")]
    pub out: PathBuf,
}

/// `plimsoll trial`.
#[derive(Debug, Args)]
pub struct TrialArgs {
    /// The simulator, by the name its image declares (`plimsoll image show IMAGE` lists them).
    #[arg(long, value_name = "NAME")]
    pub simulator: String,
    /// And the SHA-256 its module must have (64 hex digits).
    #[arg(long, value_name = "HEX")]
    pub simulator_sha256: Option<String>,
    /// A scenario file (JSON, docs/simulators.md); repeat for several trials, run in order.
    #[arg(long = "scenario", value_name = "FILE", required = true)]
    pub scenarios: Vec<PathBuf>,
    /// The controller: a .js file (run by node) or a .py file (run by python3).
    #[arg(long, value_name = "FILE")]
    pub controller: PathBuf,
    /// Another file the controller needs, written as NAME under /work (default: PATH's file
    /// name); repeat for more.
    #[arg(long = "file", value_name = "PATH[=NAME]")]
    pub files: Vec<String>,
    /// Write the trajectories (one per scenario, SCENARIO.bin) under this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Answer deadline for the first tick, in ms (the interpreter starts meanwhile).
    #[arg(long, value_name = "MS")]
    pub first_deadline_ms: Option<u64>,
    /// Answer deadline for every later tick, in ms.
    #[arg(long, value_name = "MS")]
    pub tick_deadline_ms: Option<u64>,
    /// Leave the wall time out of the verdict, so identical trials give identical results.
    #[arg(long)]
    pub reproducible: bool,
    /// The floor: the weakest tier to accept (a trial needs container or above).
    #[arg(long, value_name = "TIER", value_parser = parse_tier)]
    pub min_isolation: Option<Tier>,
    /// Run on this provider only.
    #[arg(long, value_name = "NAME")]
    pub provider: Option<String>,
    /// Run in this image (a name or an identity): the one that carries the simulator.
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// Wall-clock timeout of the whole run in milliseconds.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: Option<u64>,
    /// Send the run to this daemon (token from PLIMSOLL_TOKEN). Default: PLIMSOLL_DAEMON,
    /// else the embedded engine.
    #[arg(long, value_name = "URL")]
    pub daemon: Option<String>,
    /// Print the whole response (or the error object) as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Where a session command goes: a daemon (sessions live in a daemon, not in this process).
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The daemon (token from PLIMSOLL_TOKEN). Default: PLIMSOLL_DAEMON.
    #[arg(long, value_name = "URL")]
    pub daemon: Option<String>,
    /// Print the answer as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Append the call's exchange (`{"request":…,"response":…}`, the request as sent and the
    /// verified answer) as one line to this file, for `plimsoll-attest sign`.
    #[arg(long, value_name = "FILE.jsonl")]
    pub exchanges: Option<PathBuf>,
}

/// `plimsoll session ...`.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Open a session and print its id on stdout (the tier and provider on stderr).
    Open {
        /// The interpreter's language: javascript (js) or python (py).
        #[arg(long, value_name = "LANG", value_parser = parse_language)]
        lang: Language,
        /// The floor: the weakest tier to accept.
        #[arg(long, value_name = "TIER", value_parser = parse_tier)]
        min_isolation: Option<Tier>,
        /// Open it on this provider (crun, runc, runsc, qemu).
        #[arg(long, value_name = "NAME")]
        provider: Option<String>,
        /// Open it in this image (a name or an identity), fixed for its life.
        #[arg(long, value_name = "IMAGE")]
        image: Option<String>,
        /// Hold this grant profile for the session's whole life: an API grant (`host.get(...)`
        /// in JavaScript, `plimsoll_host` in Python) or an egress grant (HTTPS_PROXY for pip,
        /// npm, urllib, fetch); see docs/capability-grants.md. Each call then prints the calls
        /// and connection attempts since the call before.
        #[arg(long, value_name = "PROFILE")]
        grant: Option<String>,
        /// End it after this long without a call, in milliseconds.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        idle_timeout_ms: Option<u64>,
        /// End it this long after it opened, in milliseconds.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        max_lifetime_ms: Option<u64>,
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// Run a cell in the session's interpreter; its output comes as it is printed.
    Run {
        /// The session id.
        id: String,
        /// The code (else FILE, or standard input).
        #[arg(short = 'e', long = "eval", value_name = "CODE")]
        code: Option<String>,
        /// A file holding the code; `-` or nothing reads standard input.
        #[arg(value_name = "FILE", conflicts_with = "code")]
        file: Option<PathBuf>,
        /// Start a fresh interpreter first (after it ended, or to drop its state).
        #[arg(long)]
        restart: bool,
        /// This cell's timeout, in milliseconds.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        timeout_ms: Option<u64>,
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// Run shell steps in order in the session's /work; output comes as it is printed.
    Step {
        /// The session id.
        id: String,
        /// The commands, each run by `/bin/sh -c`.
        #[arg(required = true, value_name = "CMD")]
        steps: Vec<String>,
        /// The steps' timeout, in milliseconds.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        timeout_ms: Option<u64>,
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// Write a local file (or standard input) to /work/PATH in the session, bytes exact.
    Put {
        /// The session id.
        id: String,
        /// The path under /work.
        path: String,
        /// The local file; `-` or nothing reads standard input.
        #[arg(long, value_name = "FILE")]
        from: Option<PathBuf>,
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// Read /work/PATH from the session to standard output (or --out FILE), bytes exact.
    Get {
        /// The session id.
        id: String,
        /// The path under /work.
        path: String,
        /// Write it here instead of standard output.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// Close the session: its sandbox is removed.
    Close {
        /// The session id.
        id: String,
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// List this caller's open sessions.
    List {
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// Snapshot the session (paused while it is saved; it goes on) and print the snapshot's
    /// id on stdout (its digest and size on stderr). runsc sessions in Python only.
    Snapshot {
        /// The session id.
        id: String,
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// Fork the session into N new sessions, each with fresh randomness; print their ids on
    /// stdout, one a line.
    Fork {
        /// The session id.
        id: String,
        /// How many copies.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// Open a new session restored from a snapshot and print its id on stdout.
    Restore {
        /// The snapshot id.
        snapshot: String,
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// List this caller's snapshots.
    Snapshots {
        #[command(flatten)]
        to: DaemonArgs,
    },
    /// Delete a snapshot: its files are removed.
    DropSnapshot {
        /// The snapshot id.
        snapshot: String,
        #[command(flatten)]
        to: DaemonArgs,
    },
}

/// `plimsoll providers`.
#[derive(Debug, Args)]
pub struct ProvidersArgs {
    /// Print the providers response as JSON.
    #[arg(long)]
    pub json: bool,
    /// Ask this daemon (token from PLIMSOLL_TOKEN). Default: PLIMSOLL_DAEMON, else the
    /// embedded engine.
    #[arg(long, value_name = "URL")]
    pub daemon: Option<String>,
}

/// `plimsoll image ...`: the image store of the settings (`[images] store`, by default the
/// repository's build/images), or with --daemon (list only) a daemon's images.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// List the images: name, identity, the languages each starts, whether qemu can boot it.
    List {
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
        /// Ask this daemon (token from PLIMSOLL_TOKEN). Default: PLIMSOLL_DAEMON, else the
        /// settings' image store.
        #[arg(long, value_name = "URL")]
        daemon: Option<String>,
    },
    /// Show one image: its identity, where it lives, what it starts, its size and source.
    Show {
        /// Its name or identity.
        image: String,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Say what an image offers, by running in it (embedded engine, the settings' default
    /// floor, or --provider): Python, JavaScript and a shell step, each started for real.
    Check {
        /// Its name or identity.
        image: String,
        /// Run the checks at this provider.
        #[arg(long, value_name = "NAME")]
        provider: Option<String>,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Build an image from its recipe in the repository (images/NAME/: Debian packages,
    /// hashed wheels, an npm lockfile) with scripts/build-image; the same recipe and the
    /// same package bytes give the same identity. Progress on stderr.
    Build {
        /// The recipe's name (images/NAME/).
        name: String,
        /// Build even when the image is up to date with its recipe.
        #[arg(long)]
        force: bool,
    },
    /// Import an image built elsewhere into the store: a `docker save` or `podman save`
    /// archive, an OCI archive (`buildah push oci-archive:...`) or an OCI image layout
    /// directory. Layers are untrusted: device nodes go, set-id bits and file capabilities
    /// are cleared, nothing is written outside the store. Progress on stderr.
    Import {
        /// The archive or layout directory.
        source: PathBuf,
        /// The name it gets in the store (a-z 0-9 . _ -); an existing name is refused.
        #[arg(long, value_name = "NAME")]
        name: String,
        /// Print what was imported as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove an image from the store (not the default one). Refused while a process of this
    /// host uses it (a run, session or warm member in it); new requests naming it are
    /// refused once it is gone.
    Rm {
        /// Its name.
        name: String,
    },
}

/// `plimsoll callers ...`.
#[derive(Debug, Subcommand)]
pub enum CallersCommand {
    /// Add a caller and print its new token, once, on stdout. The file keeps only its SHA-256.
    Add {
        /// The caller's name: 1 to 64 characters of a-z 0-9 . _ -.
        name: String,
        /// The callers file. Default: the settings' [daemon].callers_file, else
        /// /etc/plimsoll/callers.toml.
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
    },
}

/// `plimsoll bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Measured runs per case.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Unmeasured runs per case first.
    #[arg(long, default_value_t = 3)]
    pub warmup: u32,
    /// Seconds of each sustained-throughput measurement.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=600))]
    pub seconds: u32,
    /// Measure only sessions (open time, cell round trips), `--runs` times 3 cells (at
    /// least 20) per provider that keeps sessions and language.
    #[arg(long)]
    pub sessions_only: bool,
    /// Measure images instead, at crun: warm and cold Python starts in each image named
    /// (comma-separated, e.g. `sandbox,python-data`), interleaved in one run, and a session
    /// cell in the last one after it imported pandas.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub images: Option<Vec<String>>,
    /// Also measure the split daemon (docs/privileges.md, "The split daemon"): two more
    /// plimsolld, without pools and with, serving as this user through their launchers;
    /// their cases are labelled `split`, interleaved with the others.
    #[arg(long, value_name = "USER")]
    pub serving_user: Option<String>,
}

/// `plimsoll init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Overwrite an existing settings file.
    #[arg(long)]
    pub force: bool,
    /// The first caller to add (its token is printed once, on stdout).
    #[arg(long, value_name = "NAME", default_value = "admin")]
    pub caller: String,
    /// Providers to probe, comma-separated. Default: every provider this build has.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub providers: Option<Vec<String>>,
    /// The daemon's state directory (runs' directories; created with mode 0711).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/plimsoll")]
    pub state_dir: PathBuf,
    /// The callers file (created with mode 0600, in a directory of mode 0700 if new).
    /// Default: callers.toml beside the settings file.
    #[arg(long, value_name = "FILE")]
    pub callers_file: Option<PathBuf>,
    /// The address plimsolld listens on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7878")]
    pub listen: String,
    /// The sandbox image `make images` built (holding rootfs/ and identity). Default: the
    /// repository's build/images/sandbox beside this binary, else
    /// /var/lib/plimsoll/build/images/sandbox.
    #[arg(long, value_name = "DIR")]
    pub image: Option<PathBuf>,
    /// The VM assets `make vm-assets` built. Default: the repository's build/vm beside this
    /// binary, else /var/lib/plimsoll/build/vm.
    #[arg(long, value_name = "DIR")]
    pub vm_assets: Option<PathBuf>,
    /// First uid of the sandbox uid range (two daemons on one host need disjoint ranges).
    #[arg(long, value_name = "UID")]
    pub sandbox_uid_base: Option<u32>,
}

/// `plimsoll doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the findings as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

fn parse_tier(s: &str) -> Result<Tier, String> {
    s.parse::<Tier>().map_err(|e| e.to_string())
}

fn parse_language(s: &str) -> Result<Language, String> {
    s.parse::<Language>()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_lists_every_environment_variable_and_exit_status() {
        let help = Cli::command().render_long_help().to_string();
        for v in plimsoll_env::ALL {
            assert!(help.contains(v.name), "{} missing from --help", v.name);
        }
        assert!(help.contains("not dispatched"));
    }

    #[test]
    fn a_session_opens_with_the_grant_it_names() {
        use clap::Parser as _;
        let cli = Cli::try_parse_from([
            "plimsoll", "session", "open", "--lang", "py", "--grant", "pkgs",
        ])
        .unwrap();
        let Command::Session(SessionCommand::Open { lang, grant, .. }) = cli.command else {
            panic!("not a session open: {cli:?}");
        };
        assert_eq!((lang, grant.as_deref()), (Language::Python, Some("pkgs")));
        let cli = Cli::try_parse_from(["plimsoll", "session", "open", "--lang", "js"]).unwrap();
        let Command::Session(SessionCommand::Open { grant, .. }) = cli.command else {
            panic!("not a session open: {cli:?}");
        };
        assert_eq!(grant, None);
    }
}
