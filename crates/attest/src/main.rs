//! plimsoll-attest: parses arguments and calls the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use plimsoll_client::{Client, RunOptions, Token};
use plimsoll_env as env;
use plimsoll_wire::{Language, Tier};

/// Signs checked plimsoll results into a chained, closed bundle; verifies and replays bundles.
#[derive(Debug, Parser)]
#[command(name = "plimsoll-attest", version, after_help = env_help())]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn env_help() -> String {
    env::help_text()
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate an Ed25519 key pair: PREFIX.key (PKCS#8 PEM, mode 0600) and PREFIX.pub.
    Keygen {
        /// Path prefix of the two files; neither may exist.
        #[arg(long, value_name = "PREFIX")]
        out: PathBuf,
    },
    /// Run code through a daemon, check the result, and sign it into a bundle.
    #[command(after_help = env_help())]
    Run(RunArgs),
    /// Sign stored exchanges (one JSON per line), in order, as one chain, and close the bundle.
    ///
    /// Every exchange is checked, and the calls of a session must form its chain whole and in
    /// order, before anything is signed.
    Sign {
        /// The private key (PREFIX.key).
        #[arg(long, value_name = "PREFIX.key")]
        key: PathBuf,
        /// The bundle to append to (created if missing); closed afterwards.
        bundle: PathBuf,
        /// The exchanges: one `{"request":…,"response":…}` per line.
        #[arg(value_name = "EXCHANGES.jsonl")]
        exchanges: PathBuf,
    },
    /// Append a signed close (count of entries, last entry's digest) to a bundle.
    Close {
        /// The private key (PREFIX.key).
        #[arg(long, value_name = "PREFIX.key")]
        key: PathBuf,
        /// The bundle.
        bundle: PathBuf,
    },
    /// Check every signature, digest, sequence, link and the close of a bundle.
    Verify {
        /// The signer's public key (PREFIX.pub).
        #[arg(long = "pub", value_name = "PREFIX.pub")]
        public: PathBuf,
        /// The bundle.
        bundle: PathBuf,
    },
    /// Verify a bundle, then resend each request and compare the result digests.
    #[command(after_help = env_help())]
    Replay {
        /// The daemon URL (default: $PLIMSOLL_DAEMON).
        #[arg(long, value_name = "URL")]
        daemon: Option<String>,
        /// The signer's public key (PREFIX.pub); required, since replay verifies first.
        #[arg(long = "pub", value_name = "PREFIX.pub")]
        public: PathBuf,
        /// The bundle.
        bundle: PathBuf,
    },
    /// Time signing and verifying (figures only).
    #[command(hide = true)]
    Bench {
        /// Entries per round.
        #[arg(long, default_value_t = 1000)]
        entries: u64,
        /// Rounds (medians are printed).
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// Directory for the scratch bundles (default: the system temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The daemon URL (default: $PLIMSOLL_DAEMON).
    #[arg(long, value_name = "URL")]
    daemon: Option<String>,
    /// The private key (PREFIX.key).
    #[arg(long, value_name = "PREFIX.key")]
    key: PathBuf,
    /// The bundle to append to (created if missing).
    #[arg(long, value_name = "FILE")]
    bundle: PathBuf,
    /// The code to run (instead of FILE).
    #[arg(
        short = 'e',
        long = "eval",
        value_name = "CODE",
        conflicts_with = "file"
    )]
    code: Option<String>,
    /// A file holding the code to run (language from its extension unless --lang).
    #[arg(value_name = "FILE", required_unless_present = "code")]
    file: Option<PathBuf>,
    /// javascript (js) or python (py).
    #[arg(long, value_name = "LANG")]
    lang: Option<Language>,
    /// The weakest tier accepted: process, container, kernel or vm.
    #[arg(long, value_name = "TIER")]
    min_isolation: Option<Tier>,
    /// Run on this provider only.
    #[arg(long, value_name = "NAME")]
    provider: Option<String>,
    /// Wall timeout in milliseconds.
    #[arg(long, value_name = "MS")]
    timeout_ms: Option<u64>,
}

fn daemon_url(flag: Option<String>) -> anyhow::Result<String> {
    flag.or_else(|| env::get(env::PLIMSOLL_DAEMON))
        .context("no daemon: pass --daemon URL or set PLIMSOLL_DAEMON")
}

fn client(daemon: Option<String>) -> anyhow::Result<Client> {
    let url = daemon_url(daemon)?;
    let token = env::get(env::PLIMSOLL_TOKEN)
        .context("no caller token: set PLIMSOLL_TOKEN to the token your operator gave you")?;
    Ok(Client::new(url, Token::new(token)))
}

fn language_of(file: &Path) -> Option<Language> {
    match file.extension()?.to_str()? {
        "py" => Some(Language::Python),
        "js" | "mjs" | "cjs" => Some(Language::Javascript),
        _ => None,
    }
}

fn run_options(args: &RunArgs) -> anyhow::Result<RunOptions> {
    let (code, language) = match (&args.code, &args.file) {
        (Some(code), _) => (
            code.clone(),
            args.lang.context("-e needs --lang javascript|python")?,
        ),
        (None, Some(file)) => {
            let code = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let language = args.lang.or_else(|| language_of(file)).with_context(|| {
                format!(
                    "cannot tell the language of {}: pass --lang javascript|python",
                    file.display()
                )
            })?;
            (code, language)
        }
        (None, None) => bail!("give the code: -e CODE or a FILE"),
    };
    let mut options = RunOptions::snippet(language, code);
    if let Some(t) = args.min_isolation {
        options = options.min_isolation(t);
    }
    if let Some(p) = &args.provider {
        options = options.provider(p.clone());
    }
    if let Some(ms) = args.timeout_ms {
        options = options.timeout_ms(ms);
    }
    Ok(options)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("plimsoll-attest: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn execute(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Keygen { out } => {
            let files = plimsoll_attest::keygen(&out)?;
            println!(
                "wrote {} (private, mode 0600) and {}\nkey id {}",
                files.private.display(),
                files.public.display(),
                files.key_id
            );
        }
        Command::Run(args) => {
            let options = run_options(&args)?;
            let key = plimsoll_attest::load_private_key(&args.key)?;
            let client = client(args.daemon.clone())?;
            match plimsoll_attest::run_and_sign(&client, options, &key, &args.bundle) {
                Ok(signed) => {
                    let resp = &signed.exchange.response;
                    let exit = match (resp.result.exit_code, resp.result.signal) {
                        (Some(c), _) => format!("exit {c}"),
                        (None, Some(s)) => format!("signal {s}"),
                        (None, None) => "no exit status".into(),
                    };
                    println!(
                        "signed entry {} (line {}) run:{} into {}: {} ({}), {}{}, record sha256:{}",
                        signed.appended.sequence,
                        signed.appended.line,
                        resp.request_id,
                        args.bundle.display(),
                        resp.provider,
                        resp.isolation,
                        exit,
                        if resp.result.timed_out {
                            ", timed out"
                        } else {
                            ""
                        },
                        resp.record.record_sha256,
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
        Command::Sign {
            key,
            bundle,
            exchanges,
        } => {
            let exchanges = plimsoll_attest::read_exchanges(&exchanges)?;
            let key = plimsoll_attest::load_private_key(&key)?;
            let signed = plimsoll_attest::sign_chain(&bundle, &key, &exchanges)?;
            let (first, last) = (
                signed.entries.first().map_or(0, |a| a.sequence),
                signed.entries.last().map_or(0, |a| a.sequence),
            );
            println!(
                "signed {} entries (sequences {first} to {last}) into {} and closed it (close at line {})",
                signed.entries.len(),
                bundle.display(),
                signed.close.line
            );
        }
        Command::Close { key, bundle } => {
            let key = plimsoll_attest::load_private_key(&key)?;
            let closed = plimsoll_attest::close_bundle(&bundle, &key)?;
            println!(
                "closed {} after {} entries (close at line {})",
                bundle.display(),
                closed.sequence,
                closed.line
            );
        }
        Command::Verify { public, bundle } => {
            let key = plimsoll_attest::load_public_key(&public)?;
            let verified = plimsoll_attest::verify_bundle(&bundle, &key)
                .with_context(|| format!("{} REFUSED", bundle.display()))?;
            print!("{}", verified.summary());
        }
        Command::Replay {
            daemon,
            public,
            bundle,
        } => {
            let key = plimsoll_attest::load_public_key(&public)?;
            let client = client(daemon)?;
            let report = plimsoll_attest::replay_bundle(&client, &bundle, &key)?;
            print!("{}", report.render());
            if !report.all_same() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Bench {
            entries,
            rounds,
            dir,
        } => {
            let base = dir.unwrap_or_else(std::env::temp_dir);
            let dir = base.join(format!("plimsoll-attest-bench-{}", std::process::id()));
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let report = plimsoll_attest::bench::run_bench(&dir, entries, rounds.max(1));
            let _ = std::fs::remove_dir_all(&dir);
            let r = report?;
            println!(
                "entries per round {}, rounds {} (medians)\n\
                 sign (in memory)        {:>10.0} entries/s\n\
                 append (lock+fsync)     {:>10.0} entries/s\n\
                 verify (from memory)    {:>10.0} entries/s\n\
                 entry line              {:>10} bytes (trivial snippet)\n\
                 close line              {:>10} bytes",
                r.entries,
                r.rounds,
                r.sign_per_sec,
                r.append_per_sec,
                r.verify_per_sec,
                r.entry_bytes,
                r.close_bytes
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
