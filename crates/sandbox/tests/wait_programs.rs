//! A member's interpreter runs its code as the bare interpreter runs a file: the same snippet
//! through [`plimsoll_sandbox::warm::wait_command`] (handed `go`) and as `node FILE` or
//! `python3 -I -B FILE` gives the same standard output, standard error (tracebacks, stack
//! frames and all) and status. Run on the host's interpreters, outside any sandbox: what is
//! compared is the wait programs, not a wall.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use plimsoll_sandbox::warm::{GO, wait_command};
use plimsoll_sandbox::{CaptureLimits, Spawn, capture};
use plimsoll_wire::Language;

const NODE: &str = "/usr/bin/node";
const PYTHON: &str = "/usr/bin/python3";

const PYTHON_CASES: &[&str] = &[
    "print('a')",
    "import sys; sys.exit(3)",
    "import sys; sys.exit('bye')",
    "raise ValueError('x')",
    "def f():\n    raise KeyError(1)\ndef g():\n    f()\ng()",
    "try:\n    1/0\nexcept Exception as e:\n    raise ValueError('y') from e",
    "def (",
    "import sys\nprint(__name__, sys.argv, __file__, __spec__, __package__, __doc__, __cached__)",
    "import sys; m = sys.modules['__main__']; print(list(vars(m)), type(m.__loader__).__name__, m.__loader__.name, m.__loader__.path == __file__)",
    "import atexit\natexit.register(lambda: print('at exit'))\nprint('main')",
    "# -*- coding: latin-1 -*-\nprint('\u{e9}')",
    "import threading, time\ndef f():\n    time.sleep(0.1)\n    print('thread')\nthreading.Thread(target=f).start()\nprint('main')",
    "import sys; sys.stdout.write('no newline')",
    "import sys; print(sys.stdin.read() == '', len(sys.path) > 0)",
];

const JS_CASES: &[&str] = &[
    "console.log('a')",
    "process.exit(3)",
    "throw new Error('x')",
    "function f() { throw new TypeError('t') }\nf()",
    "Promise.reject(new Error('rejected'))",
    "let x = ;",
    "process.stdout.write('no newline')",
    "process.on('exit', (c) => console.log('exit', c)); console.log('main')",
    "process.on('beforeExit', () => console.log('before')); console.log('main')",
    "setTimeout(() => console.log('later'), 50); console.log('now')",
    "process.exitCode = 4",
    "console.log(require.main === module, __filename, process.argv.length, module.id, process.execArgv)",
    "console.log(Object.keys(globalThis).sort().join(','), Object.keys(require.cache))",
    "const { fork } = require('child_process');\nif (process.argv[2]) { console.log('child', process.execArgv) } else { fork(__filename, ['x']).on('exit', (c) => console.log('child exit', c)) }",
    "let s = ''; process.stdin.on('data', (d) => s += d).on('end', () => console.log(JSON.stringify(s)))",
];

/// What a run gave: its status, standard output and standard error.
type Output = (Option<i32>, Vec<u8>, Vec<u8>);

/// `program` started with `args` (environment cleared, standard input empty unless `input`
/// is given, then closed), run to its end.
fn run(program: &str, args: &[String], input: Option<&[u8]>) -> Output {
    let mut spawn = Spawn::new(program, "/").args(args);
    if input.is_some() {
        spawn = spawn.stdin_pipe();
    }
    let mut running = spawn.spawn().expect("the interpreter starts");
    if let Some(input) = input {
        let mut stdin = running.stdin.take().expect("its input");
        stdin.write_all(input).expect("the input");
    }
    let c = capture(
        running,
        &CaptureLimits::new(1 << 20, Duration::from_secs(30)),
    )
    .expect("its output");
    (c.exit_code, c.stdout, c.stderr)
}

/// `program` run bare on `file`.
fn bare(program: &str, args: &[&str], file: &Path) -> Output {
    let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    args.push(file.display().to_string());
    run(program, &args, None)
}

/// `program` started as a member's interpreter for `file`, then handed `input` (`go`).
fn waited(program: &str, language: Language, file: &Path, input: &[u8]) -> Output {
    let wait = wait_command(language, file, false, false);
    for (name, text) in &wait.files {
        std::fs::write(file.with_file_name(name), text).expect("the wait program's file");
    }
    run(program, &wait.args, Some(input))
}

fn compare(language: Language, program: &str, bare_args: &[&str], cases: &[&str]) {
    if !Path::new(program).exists() {
        plimsoll_testing::skip_or_fail(
            "wait_programs",
            &format!("{program} is not installed (scripts/install-deps)"),
        );
        return;
    }
    let dir = tempfile::tempdir().expect("a directory");
    let name = match language {
        Language::Javascript => "main.js",
        Language::Python => "main.py",
    };
    let file = dir.path().join(name);
    let mut differ = Vec::new();
    for case in cases {
        std::fs::write(&file, case).expect("the code");
        let a = bare(program, bare_args, &file);
        let b = waited(program, language, &file, GO);
        if a != b {
            differ.push(format!(
                "{case:?}:\n  bare:   {:?} {:?} {:?}\n  waited: {:?} {:?} {:?}",
                a.0,
                String::from_utf8_lossy(&a.1),
                String::from_utf8_lossy(&a.2),
                b.0,
                String::from_utf8_lossy(&b.1),
                String::from_utf8_lossy(&b.2),
            ));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

#[test]
fn a_waiting_python_runs_its_code_as_python3_runs_a_file() {
    compare(Language::Python, PYTHON, &["-I", "-B"], PYTHON_CASES);
}

#[test]
fn a_waiting_node_runs_its_code_as_node_runs_a_file() {
    compare(Language::Javascript, NODE, &[], JS_CASES);
}

/// Without `go` (the daemon went away before a claim) nothing of the code runs.
#[test]
fn a_waiting_interpreter_whose_input_closes_without_go_runs_nothing() {
    let dir = tempfile::tempdir().expect("a directory");
    for (language, program, name, code) in [
        (Language::Python, PYTHON, "main.py", "print('ran')"),
        (Language::Javascript, NODE, "main.js", "console.log('ran')"),
    ] {
        if !Path::new(program).exists() {
            plimsoll_testing::skip_or_fail(
                "wait_programs",
                &format!("{program} is not installed (scripts/install-deps)"),
            );
            return;
        }
        let file = dir.path().join(name);
        std::fs::write(&file, code).expect("the code");
        for input in [&b""[..], b"go", b"go\nmore", b"no\n"] {
            let (status, stdout, _) = waited(program, language, &file, input);
            assert_eq!(
                (status, stdout.as_slice()),
                (Some(75), &b""[..]),
                "{language:?} given {input:?}"
            );
        }
    }
}
