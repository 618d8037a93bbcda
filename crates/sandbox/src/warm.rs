//! Warm members: a fresh sandbox made ahead of any request, its interpreter already started
//! and waiting for its code. A member gives exactly one run ([`WarmMember::run`] consumes
//! it) and is destroyed after it, or unclaimed ([`WarmMember::discard`]); it never returns
//! to its pool. The engine's pools (crates/engine/src/pool.rs) decide when members are made,
//! claimed and dropped; a provider only makes them and runs them.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use plimsoll_wire::Language;

use crate::{Cause, LaunchError, LaunchPlan, Outcome};

/// What a member is made for: everything fixed before the code is known. A run claims a
/// member only when its own language and limits are exactly these (and its provider's
/// evidence is the one the member was made under; the engine checks that).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WarmShape {
    /// The interpreter that waits.
    pub language: Language,
    /// The memory limit, bytes.
    pub memory_bytes: u64,
    /// The processes-and-threads limit.
    pub pids: u64,
    /// The writable disk, bytes.
    pub disk_bytes: u64,
}

/// Where and as whom one member is made.
#[derive(Debug, Clone)]
pub struct WarmPlan {
    /// A fresh id, unique on this host; names the member's directory, container, cgroup.
    pub member_id: String,
    /// What it is made for.
    pub shape: WarmShape,
    /// The unprivileged uid its code will run as, held by the member alone for its life.
    pub uid: u32,
    /// The gid.
    pub gid: u32,
    /// Where the provider keeps the member's files; created by the provider, removed with it.
    pub run_dir: PathBuf,
    /// The longest timeout a run may ask for: what can only be set when the sandbox starts
    /// (the process tier's RLIMIT_CPU) is set for this; the run's own timeout is applied when
    /// it claims the member.
    pub max_timeout: Duration,
    /// The image the member runs in (see [`crate::LaunchPlan::image`]).
    pub image: Option<crate::RunImage>,
}

/// The part of a claimed member's end that is off the answer's path: what the run left is
/// removed after the caller has its result. The member's uid must stay out of use until it
/// has run.
pub struct Teardown(Box<dyn FnOnce() -> Result<(), Cause> + Send>);

impl Teardown {
    /// A teardown that runs `f`.
    pub fn new(f: impl FnOnce() -> Result<(), Cause> + Send + 'static) -> Self {
        Teardown(Box::new(f))
    }

    /// Removes everything of the member: its processes, files, mounts, cgroups.
    pub fn run(self) -> Result<(), Cause> {
        (self.0)()
    }
}

impl fmt::Debug for Teardown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Teardown")
    }
}

/// A member of a warm pool: a started sandbox whose interpreter waits for one run's code.
pub trait WarmMember: Send + fmt::Debug {
    /// The uid the member's code runs as (the plan given to [`WarmMember::run`] must name it).
    fn uid(&self) -> u32;

    /// Gives the member its one run: the code, the timeout and the output cap come from
    /// `plan` (whose language and limits must match the member's shape: `Err` and nothing
    /// run otherwise). Blocks until the run's result is complete. Its processes are killed
    /// before this returns; the rest of its removal is the returned [`Teardown`]. On `Err`
    /// the member is already removed (a failed removal kept beside the error).
    fn run(self: Box<Self>, plan: &LaunchPlan) -> Result<(Outcome, Teardown), LaunchError>;

    /// Destroys a member that was never claimed: its processes, files, mounts, cgroups.
    fn discard(self: Box<Self>) -> Result<(), Cause>;
}

/// Why a member was not claimed with this plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// Not a snippet.
    #[error("a warm member runs one snippet; this plan is a project")]
    NotSnippet,
    /// Another language, or other fixed limits.
    #[error("the plan's language and limits are not the member's ({0})")]
    Shape(String),
    /// Another uid.
    #[error("the plan names uid {plan}, the member runs as {member}")]
    Uid {
        /// The plan's.
        plan: u32,
        /// The member's.
        member: u32,
    },
    /// A timeout over the member's maximum.
    #[error("the plan's timeout is over the member's maximum")]
    Timeout,
    /// A broker channel or the trial runner's privileges (members have neither).
    #[error("a warm member has no broker channel and no privileges")]
    Privileged,
    /// Another image.
    #[error("the plan's image is {plan:?}, the member's {member:?}")]
    Image {
        /// The plan's identity.
        plan: Option<String>,
        /// The member's.
        member: Option<String>,
    },
}

/// Checks that `plan` may claim a member of `shape` running as `uid` made for `max_timeout`;
/// the code of the snippet on success.
/// `brokered`: the member was made with `plan`'s own broker channel (a cold run's member,
/// made for that run alone, [`cold_member_plan`]). `image`: the identity of the image the
/// member was made in.
pub fn check_claim<'a>(
    plan: &'a LaunchPlan,
    shape: &WarmShape,
    uid: u32,
    max_timeout: Duration,
    brokered: bool,
    image: Option<&str>,
) -> Result<&'a str, Mismatch> {
    let plimsoll_wire::RunSpec::Snippet(snippet) = &plan.spec else {
        return Err(Mismatch::NotSnippet);
    };
    let asked = WarmShape {
        language: snippet.language,
        memory_bytes: plan.limits.memory_bytes,
        pids: plan.limits.pids,
        disk_bytes: plan.limits.disk_bytes,
    };
    if asked != *shape {
        return Err(Mismatch::Shape(format!("{asked:?} against {shape:?}")));
    }
    if plan.uid != uid {
        return Err(Mismatch::Uid {
            plan: plan.uid,
            member: uid,
        });
    }
    if plan.limits.timeout > max_timeout {
        return Err(Mismatch::Timeout);
    }
    if plan.broker.is_some() != brokered || plan.privileges.is_trial() {
        return Err(Mismatch::Privileged);
    }
    let asked = plan.image.as_ref().map(|i| i.identity.as_str());
    if asked != image {
        return Err(Mismatch::Image {
            plan: asked.map(str::to_owned),
            member: image.map(str::to_owned),
        });
    }
    Ok(&snippet.code)
}

/// The member a cold run of `plan` is made through, when it can be: a snippet without
/// privileges, and without a broker channel unless the provider can make a member with the
/// run's own (`grants`). A cold run so made is a member made for this run alone and claimed
/// at once ([`run_made`]): its interpreter waits for its code like an idle member's, so its
/// wall is read and checked before the code is handed over, warm or cold alike. `None` for
/// a run a member cannot take (it runs as before, without a wall).
pub fn cold_member_plan(plan: &LaunchPlan, grants: bool) -> Option<WarmPlan> {
    let plimsoll_wire::RunSpec::Snippet(snippet) = &plan.spec else {
        return None;
    };
    if (plan.broker.is_some() && !grants) || plan.privileges.is_trial() {
        return None;
    }
    Some(WarmPlan {
        member_id: plan.run_id.clone(),
        shape: WarmShape {
            language: snippet.language,
            memory_bytes: plan.limits.memory_bytes,
            pids: plan.limits.pids,
            disk_bytes: plan.limits.disk_bytes,
        },
        uid: plan.uid,
        gid: plan.gid,
        run_dir: plan.run_dir.clone(),
        max_timeout: plan.limits.timeout,
        image: plan.image.clone(),
    })
}

/// The plan a member's sandbox is made from: a cold run's of its shape, with no code yet,
/// no output, no broker and no privileges.
pub fn member_plan(plan: &WarmPlan) -> LaunchPlan {
    LaunchPlan {
        run_id: plan.member_id.clone(),
        request_id: format!("warm member {}", plan.member_id),
        spec: plimsoll_wire::RunSpec::Snippet(plimsoll_wire::Snippet {
            language: plan.shape.language,
            code: String::new(),
        }),
        limits: crate::ResolvedLimits {
            timeout: plan.max_timeout,
            memory_bytes: plan.shape.memory_bytes,
            output_bytes: 0,
            pids: plan.shape.pids,
            disk_bytes: plan.shape.disk_bytes,
            artifact_bytes: 0,
        },
        uid: plan.uid,
        gid: plan.gid,
        controller_uid: plan.uid,
        controller_gid: plan.gid,
        run_dir: plan.run_dir.clone(),
        broker: None,
        privileges: crate::Privileges::Unprivileged,
        tap: None,
        image: plan.image.clone(),
    }
}

/// Gives `member` (made from [`cold_member_plan`]) its run; its removal is the returned
/// teardown, for the caller to run after answering ([`Provider::run_then_tear_down`]) or
/// at once ([`tear_down_now`]).
///
/// [`Provider::run_then_tear_down`]: crate::Provider::run_then_tear_down
pub fn run_made(
    member: Box<dyn WarmMember>,
    plan: &LaunchPlan,
) -> Result<(Outcome, Option<Teardown>), LaunchError> {
    member.run(plan).map(|(o, t)| (o, Some(t)))
}

/// A run's outcome once its teardown, if any, has run (before answering, as
/// [`crate::Provider::run`] promises): a failed removal makes the run's answer an error.
pub fn tear_down_now(
    ran: Result<(Outcome, Option<Teardown>), LaunchError>,
) -> Result<Outcome, LaunchError> {
    let (outcome, teardown) = ran?;
    if let Some(teardown) = teardown {
        teardown.run().map_err(|e| {
            LaunchError::may_have_run(format!(
                "the run finished but its cleanup failed: {}",
                crate::error_chain(e.as_ref())
            ))
        })?;
    }
    Ok(outcome)
}

/// The JavaScript an idle member's node preloads (`node --require DIR/plimsoll-wait.js
/// DIR/main.js`, [`wait_command`]): it opens its standard output and error streams (loading
/// what they need, as a first `console.log` would), takes its own `--require` out of
/// `process.execArgv` (so a child node the code forks does not wait too), waits until its
/// standard input closes, and, only if it read exactly `go\n`, returns; node then runs the
/// main module itself, exactly as `node DIR/main.js` does (the same stack frames, globals,
/// `require.cache` and end). Anything else (the daemon went away before a claim) ends it
/// without running anything.
pub const JS_WAIT: &str = "process.stdout; process.stderr; \
{ const a = process.execArgv; const i = a.indexOf(__filename); \
if (i > 0 && a[i - 1] === '--require') a.splice(i - 1, 2); } \
const fs = require('fs'); const b = Buffer.alloc(16); let s = ''; \
for (;;) { let n; try { n = fs.readSync(0, b, 0, b.length, null); } \
catch (e) { if (e.code === 'EAGAIN') continue; process.exit(75); } \
if (n === 0) break; s += b.toString('latin1', 0, n); if (s.length > 3) break; } \
if (s !== 'go\\n') process.exit(75); \
delete require.cache[__filename];";

/// The file [`JS_WAIT`] is written to, beside the code, for node to preload.
pub const JS_WAIT_FILE: &str = "plimsoll-wait.js";

/// The Python an idle member's python3 runs (`python3 -I -B -c`): the same handshake as
/// [`JS_WAIT`], then the file named by its first argument runs as `__main__`, as
/// `python3 FILE` runs it: compiled from its bytes (so its coding cookie or BOM counts), in
/// a fresh `__main__` module whose `__file__` is FILE, with `sys.argv` `[FILE]`. Nothing is
/// imported for it beyond what the interpreter itself starts with (`runpy` and `pkgutil`
/// would cost a cold member about 10 ms of start-up). Its end is Python's own, in the same
/// order: an uncaught exception is printed by `sys.excepthook` from the code's own frames
/// (this program's frame left out, so the traceback reads as `python3 FILE`'s; status 1),
/// `SystemExit` gives its status (a non-integer is printed, status 1), non-daemon threads
/// are joined, `atexit` handlers run, and standard output and error are flushed; then the
/// process exits at once, without the interpreter's module teardown (objects still alive
/// then are not finalized, as Python itself does not promise).
pub const PYTHON_WAIT: &str = concat!(
    "import sys, os, atexit\n",
    "s = sys.stdin.buffer.read(4)\n",
    "if s != b'go\\n' or sys.stdin.buffer.read(1):\n",
    "    sys.exit(75)\n",
    "p = sys.argv.pop(1); sys.argv[0] = p\n",
    "del s\n",
    "def _end(code):\n",
    "    if code is None:\n",
    "        code = 0\n",
    "    elif not isinstance(code, int):\n",
    "        try:\n",
    "            print(code, file=sys.stderr)\n",
    "        except Exception:\n",
    "            pass\n",
    "        code = 1\n",
    "    t = sys.modules.get('threading')\n",
    "    if t is not None:\n",
    "        t._shutdown()\n",
    "    atexit._run_exitfuncs()\n",
    "    for f in (sys.stdout, sys.stderr):\n",
    "        try:\n",
    "            f.flush()\n",
    "        except Exception:\n",
    "            code = code or 120\n",
    "    os._exit(code & 0xff)\n",
    "m = type(sys)('__main__')\n",
    "m.__loader__ = sys.modules['_frozen_importlib_external'].SourceFileLoader('__main__', p)\n",
    "m.__annotations__ = {}\n",
    "m.__builtins__ = __builtins__\n",
    "m.__file__ = p\n",
    "m.__cached__ = None\n",
    "sys.modules['__main__'] = m\n",
    "try:\n",
    "    with open(p, 'rb') as f:\n",
    "        c = f.read()\n",
    "    c = compile(c, p, 'exec')\n",
    "    exec(c, m.__dict__)\n",
    "except SystemExit as e:\n",
    "    _end(e.code)\n",
    "except BaseException:\n",
    "    t, v, tb = sys.exc_info()\n",
    "    tb = tb.tb_next\n",
    "    sys.excepthook(t, v.with_traceback(tb), tb)\n",
    "    _end(1)\n",
    "_end(0)\n",
);

/// What a waiting interpreter made with `say_ready` ([`wait_program`]) writes on its
/// standard output once it is about to block reading its input: where the host cannot see
/// it wait (gVisor's Sentry hides it from the host's /proc), this line says the member is
/// warm. The host reads it before the capture starts; the run's output never holds it.
pub const READY_LINE: &[u8] = b"plimsoll-member: waiting\n";

/// The wait program a member's interpreter runs: [`JS_WAIT`] (preloaded from a file) or
/// [`PYTHON_WAIT`] (`python3 -I -B -c`), and
/// - with `code_dir_on_path` (a Python run with a broker, whose client sits beside the
///   code), the code's directory put first on `sys.path` once the handshake is done and the
///   code's path known, as a cold run's `PYTHON_BOOT` does (`-I` keeps it off otherwise);
///   JavaScript preloads its client with `--require` instead, so the flag changes nothing
///   there;
/// - with `say_ready`, [`READY_LINE`] written on standard output just before the wait.
pub fn wait_program(language: Language, code_dir_on_path: bool, say_ready: bool) -> String {
    let ready = String::from_utf8_lossy(READY_LINE).replace('\n', "\\n");
    match language {
        Language::Javascript => {
            const BEFORE: &str = "for (;;) {";
            if say_ready {
                JS_WAIT.replacen(BEFORE, &format!("fs.writeSync(1, '{ready}'); {BEFORE}"), 1)
            } else {
                JS_WAIT.to_owned()
            }
        }
        Language::Python => {
            const AFTER: &str = "p = sys.argv.pop(1); sys.argv[0] = p\n";
            const BEFORE: &str = "s = sys.stdin.buffer.read(4)\n";
            let mut text = PYTHON_WAIT.to_owned();
            if code_dir_on_path {
                text = text.replacen(
                    AFTER,
                    &format!("{AFTER}sys.path.insert(0, p.rpartition('/')[0])\n"),
                    1,
                );
            }
            if say_ready {
                text = text.replacen(BEFORE, &format!("os.write(1, b'{ready}')\n{BEFORE}"), 1);
            }
            text
        }
    }
}

/// How a member's interpreter is started to wait for the code file `code` (`.../main.js` or
/// `.../main.py`): the files to write into `code`'s directory first, and the arguments after
/// the interpreter's path (and after any `--require` of its own the caller puts first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitCommand {
    /// `(file name, text)`: JavaScript's wait program, [`JS_WAIT_FILE`]; none for Python.
    pub files: Vec<(&'static str, String)>,
    /// `--require DIR/plimsoll-wait.js CODE`, or `-I -B -c PROGRAM CODE`.
    pub args: Vec<String>,
}

/// The [`WaitCommand`] of a member of `language` whose code goes to `code` (as the
/// interpreter sees it), with [`wait_program`]'s `code_dir_on_path` and `say_ready`.
pub fn wait_command(
    language: Language,
    code: &std::path::Path,
    code_dir_on_path: bool,
    say_ready: bool,
) -> WaitCommand {
    let program = wait_program(language, code_dir_on_path, say_ready);
    let code_arg = code.display().to_string();
    match language {
        Language::Javascript => {
            let wait = code.with_file_name(JS_WAIT_FILE).display().to_string();
            WaitCommand {
                files: vec![(JS_WAIT_FILE, program)],
                args: vec!["--require".to_owned(), wait, code_arg],
            }
        }
        Language::Python => WaitCommand {
            files: Vec::new(),
            args: crate::PYTHON_FLAGS
                .iter()
                .map(|f| (*f).to_owned())
                .chain(["-c".to_owned(), program, code_arg])
                .collect(),
        },
    }
}

/// What a claim writes to the waiting interpreter before it closes its input.
pub const GO: &[u8] = b"go\n";

/// Waits until process `pid` (its main thread) is blocked in `read` on its standard input,
/// as an idle member's interpreter is once it has started: the member is warm from then on.
/// `Err` when it ended first, or did not get there `within`.
pub fn wait_until_reading(pid: u32, within: Duration) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + within;
    let read = libc::SYS_read.to_string();
    loop {
        // "<nr> <arg0> ..." while blocked in a system call; "running" otherwise.
        let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall"))?;
        let mut fields = syscall.split_whitespace();
        if fields.next() == Some(read.as_str()) && fields.next() == Some("0x0") {
            return Ok(());
        }
        if crate::reap::is_zombie(pid as i32) {
            return Err(std::io::Error::other(
                "it exited before it waited for its code",
            ));
        }
        if std::time::Instant::now() > deadline {
            return Err(std::io::Error::other(format!(
                "it was not waiting for its code after {} ms (last seen: {})",
                within.as_millis(),
                syscall.trim()
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod wait_program_tests {
    use super::{JS_WAIT, PYTHON_WAIT, READY_LINE, wait_program};
    use plimsoll_wire::Language::{Javascript, Python};

    #[test]
    fn with_a_broker_the_python_wait_puts_the_code_directory_on_the_path_after_the_handshake() {
        let plain = wait_program(Python, false, false);
        let brokered = wait_program(Python, true, false);
        assert_eq!(plain, PYTHON_WAIT);
        let line = "sys.path.insert(0, p.rpartition('/')[0])\n";
        let at = brokered.find(line).expect("the path line");
        assert!(at > brokered.find("sys.argv.pop(1)").unwrap());
        assert!(
            at > brokered.find("sys.exit(75)").unwrap(),
            "only after the go"
        );
        assert_eq!(brokered.len(), plain.len() + line.len());
        assert_eq!(wait_program(Javascript, true, false), JS_WAIT);
    }

    #[test]
    fn a_wait_that_says_ready_says_it_once_just_before_it_reads() {
        for (language, write, read) in [
            (
                Javascript,
                "fs.writeSync(1, 'plimsoll-member: waiting\\n'); ",
                "for (;;) {",
            ),
            (
                Python,
                "os.write(1, b'plimsoll-member: waiting\\n')\n",
                "s = sys.stdin.buffer.read(4)",
            ),
        ] {
            let said = wait_program(language, false, true);
            assert_eq!(said.matches(write).count(), 1, "{said}");
            assert_eq!(
                said.find(write).unwrap() + write.len(),
                said.find(read).unwrap()
            );
            assert_eq!(
                said.replacen(write, "", 1),
                wait_program(language, false, false)
            );
        }
        assert_eq!(READY_LINE.last(), Some(&b'\n'));
    }
}
