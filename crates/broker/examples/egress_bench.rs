//! What egress through the broker costs, measured with real clients: the added latency of one
//! HTTPS request through the broker's proxy over the same request direct (a fresh connection
//! and a full TLS handshake each, p50 and p90), and the throughput of one 64 MiB download
//! through it against the same download direct (median MB/s).
//!
//! The pieces are the real ones: scripts/egress-fixture's HTTPS files server on loopback
//! (tests/fixtures/egress/ca.pem), a [`Broker`] with an `[egress.bench]` grant serving a Unix
//! listener, and a TCP relay on a free loopback port that carries each connection to the
//! broker as the agent's relay does inside a sandbox. Three routes:
//!
//! - `direct`: client → server (the name pinned to 127.0.0.1, like `curl --resolve`);
//! - `broker`: client → Unix socket (the egress hello frame) → broker → server;
//! - `relay+broker`: client → TCP relay → Unix socket → broker → server, what code in a
//!   sandbox gets through `HTTPS_PROXY`.
//!
//! The fixture runs as the tests run it. Every hop sets TCP_NODELAY as the shipped code does:
//! the fixture's servers and the relay on the connections they accept, the broker on its
//! upstream connection (without it, a fresh connection's first answer waits ~40 ms on Nagle
//! until the peer's delayed ACK).
//!
//! Clients: Python's `http.client` (what urllib and pip use) in one long-running process, so
//! no process start is timed; then curl, one process a request, timed by curl itself
//! (`time_appconnect`, `time_total`) and from outside (wall: process start and exit too).
//! Samples of the routes are interleaved, the order rotated each round, so drift on a shared
//! host hits every case alike. Prints the host's facts, one table per measure, and the CPU
//! other processes used meanwhile. A benchmark, not a test: it asserts nothing about speed
//! (only that every answer was whole, every proxied connection has its allowed receipt, and
//! the server accepted one connection per request).
//!
//! `cargo run --release -p plimsoll-broker --example egress_bench [-- --requests N --downloads N]`

use std::collections::HashMap;
use std::error::Error as _;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plimsoll_broker::{Broker, GrantProfiles};
use plimsoll_sandbox::BrokerPort as _;
use plimsoll_sandbox::broker::EGRESS_HELLO;
use plimsoll_sandbox::spawn::Spawn;
use plimsoll_testing::egress::EgressFixture;
use serde_json::Value;

const HOST: &str = "files.plimsoll.test";
const PYTHON: &str = "/usr/bin/python3";
const CURL: &str = "/usr/bin/curl";
/// Untimed requests of each case before the latency samples (imports, first handshakes).
const WARM_REQUESTS: u32 = 5;
/// Upper bound of the grant's `max_connections`.
const MAX_CONNECTIONS: u64 = 10_000;

/// The route through the agent's relay: what code in a sandbox gets.
const RELAY: &str = "relay+broker";

/// The client: one process, one phase (`latency` or `download`), the samples of every case as
/// one JSON line on stdout. Each request opens its own connection (so pays TCP, the CONNECT
/// where proxied, and a full TLS handshake: no session is resumed) and reads the whole answer;
/// the connection is closed after the clock stops. `setup` ends when the TLS handshake does.
const CLIENT: &str = r#"
import http.client, json, socket, ssl, struct, sys, time

cfg = json.loads(sys.argv[1])
ctx = ssl.create_default_context(cafile=cfg["ca"])
HOST = cfg["host"]
HELLO = cfg["hello"].encode()


def direct(port, _):
    c = http.client.HTTPSConnection(HOST, port, context=ctx, timeout=60)
    # The name pinned to loopback, as curl --resolve does: TLS still checks HOST.
    c._create_connection = lambda addr, timeout, src: socket.create_connection(
        ("127.0.0.1", addr[1]), timeout, src)
    return c


def relay(port, proxy):
    # What urllib does with https_proxy=http://127.0.0.1:PROXY.
    c = http.client.HTTPSConnection("127.0.0.1", proxy, context=ctx, timeout=60)
    c.set_tunnel(HOST, port)
    return c


class OverChannel(http.client.HTTPSConnection):
    """The same CONNECT and TLS, over a connection to the broker's Unix socket opened with
    the egress hello: the broker without the relay."""

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(cfg["broker"])
        s.sendall(struct.pack(">I", len(HELLO)) + HELLO)
        self.sock = s
        self._tunnel()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._tunnel_host)


def broker(port, _):
    c = OverChannel("localhost", 1, context=ctx, timeout=60)
    c.set_tunnel(HOST, port)
    return c


KINDS = {"direct": direct, "broker": broker, "relay": relay}
buf = bytearray(1 << 20)


def fetch(case, path):
    t0 = time.perf_counter_ns()
    c = KINDS[case["kind"]](case["port"], case["proxy"])
    c.connect()
    t1 = time.perf_counter_ns()
    c.request("GET", path)
    r = c.getresponse()
    n = 0
    while True:
        k = r.readinto(buf)
        if not k:
            break
        n += k
    t2 = time.perf_counter_ns()
    if r.status != 200:
        sys.exit("%s GET %s: status %d" % (case["name"], path, r.status))
    c.close()
    return (t1 - t0) / 1e6, (t2 - t0) / 1e6, n


def main():
    cases, rounds, warm, path, size = (cfg["cases"], cfg["rounds"], cfg["warm"], cfg["path"],
                                       cfg["size"])
    setup = {c["name"]: [] for c in cases}
    total = {c["name"]: [] for c in cases}
    for i in range(warm + rounds):
        k = i % len(cases)
        for case in cases[k:] + cases[:k]:
            s, t, n = fetch(case, path)
            if n != size:
                sys.exit("%s GET %s: %d bytes, not %d" % (case["name"], path, n, size))
            if i >= warm:
                setup[case["name"]].append(s)
                total[case["name"]].append(t)
    print(json.dumps({"setup": setup, "total": total, "python": sys.version.split()[0],
                      "openssl": ssl.OPENSSL_VERSION}), flush=True)


main()
"#;

const USAGE: &str = "usage: egress_bench [--requests N] [--downloads N]
  --requests N   requests per case for latency, each on a fresh connection (default 200)
  --downloads N  downloads of /big (64 MiB) per route for throughput (default 5)
Needs /usr/bin/python3 and /usr/bin/curl; starts scripts/egress-fixture (its venv is made on
first use, which needs PyPI once). Figures to stdout, progress to stderr.";

fn main() {
    if let Err(e) = run() {
        eprintln!("egress_bench: {e}");
        std::process::exit(1);
    }
}

struct Args {
    requests: u32,
    downloads: u32,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        requests: 200,
        downloads: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let slot = match flag.as_str() {
            "--requests" => &mut a.requests,
            "--downloads" => &mut a.downloads,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => {
                return Err(format!("unknown argument {flag:?}\n{USAGE}"));
            }
        };
        *slot = it
            .next()
            .and_then(|v| v.parse().ok())
            .filter(|v| *v > 0)
            .ok_or_else(|| format!("{flag} takes a number above 0"))?;
    }
    if a.proxied() > MAX_CONNECTIONS {
        return Err(format!(
            "{} proxied connections would pass the grant's limit of {MAX_CONNECTIONS}: ask for fewer",
            a.proxied()
        ));
    }
    Ok(a)
}

impl Args {
    /// Connections through the broker, warm-ups included: per round (latency or download)
    /// Python's two proxied routes and curl's one.
    fn proxied(&self) -> u64 {
        3 * u64::from(self.requests + WARM_REQUESTS) + 3 * u64::from(self.downloads + 1)
    }

    /// Connections the files server accepts, warm-ups included: per round Python's three
    /// routes and curl's two.
    fn served(&self) -> u64 {
        5 * u64::from(self.requests + WARM_REQUESTS) + 5 * u64::from(self.downloads + 1)
    }
}

/// One route the Python client measures.
#[derive(Clone, Copy)]
struct Case {
    route: &'static str,
    /// `direct`, `broker` or `relay`, for the client.
    kind: &'static str,
    /// The relay's port, for `relay`.
    proxy: u16,
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    for p in [PYTHON, CURL] {
        if !Path::new(p).exists() {
            return Err(format!("{p} is missing: the bench measures real clients"));
        }
    }
    let work = tempfile::tempdir().map_err(|e| format!("cannot make a scratch dir: {e}"))?;
    eprintln!("egress_bench: starting scripts/egress-fixture");
    let fixture = EgressFixture::start(&work.path().join("fixture"))?;
    let port = fixture.port("files");
    let ca = fixture.info["ca"]
        .as_str()
        .ok_or("the fixture names no CA")?
        .to_owned();
    let big = fixture.info["big"]["bytes"]
        .as_u64()
        .ok_or("the fixture names no size for /big")?;
    let pids = [fixture.info["pid"].as_u64().unwrap_or(0) as u32];

    let grants = GrantProfiles::parse(
        &format!(
            "[egress.bench]\ncallers = [\"bench\"]\nhosts = [\"{HOST}\"]\n\
             ports = [{port}]\naddresses = [\"127.0.0.0/8\"]\n\
             resolve = {{ \"{HOST}\" = [\"127.0.0.1\"] }}\nmax_connections = {MAX_CONNECTIONS}\n\
             max_bytes_up = {max}\nmax_bytes_down = {max}\n",
            max = plimsoll_broker::egress::profile::MAX_EGRESS_BYTES
        ),
        |_| None,
    )
    .map_err(|e| format!("the bench's grant: {e}"))?;
    let grant = grants
        .authorize("bench", "bench")
        .map_err(|e| format!("the bench's grant: {e}"))?;
    let broker = Broker::start(grant, "bench", "egress-bench", Duration::from_secs(3600));
    let socket = work.path().join("broker.sock");
    let listener = UnixListener::bind(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    broker
        .serve_listener(listener)
        .map_err(|e| format!("the broker cannot serve: {e}"))?;
    let relay_port = start_relay(socket.clone())?;

    let facts = HostFacts::gather();
    let curl_version = version_line(CURL, "--version")?;
    let client_path = work.path().join("client.py");
    std::fs::write(&client_path, CLIENT).map_err(|e| format!("client.py: {e}"))?;
    let cases = [
        Case {
            route: "direct",
            kind: "direct",
            proxy: 0,
        },
        Case {
            route: "broker",
            kind: "broker",
            proxy: 0,
        },
        Case {
            route: RELAY,
            kind: "relay",
            proxy: relay_port,
        },
    ];
    let cfg = |rounds: u32, warm: u32, path: &str, size: u64| {
        let cases: Vec<Value> = cases
            .iter()
            .map(|c| {
                serde_json::json!({"name": c.route, "kind": c.kind, "port": port, "proxy": c.proxy})
            })
            .collect();
        serde_json::json!({
            "ca": ca, "host": HOST,
            "broker": socket, "hello": String::from_utf8_lossy(EGRESS_HELLO),
            "cases": cases, "rounds": rounds, "warm": warm, "path": path, "size": size,
        })
        .to_string()
    };
    let curl = Curl {
        ca: &ca,
        port,
        relay: relay_port,
    };
    let curl_routes = ["direct", RELAY];
    let started = Instant::now();

    eprintln!(
        "egress_bench: latency, Python: {} requests per route",
        args.requests
    );
    let load = Load::start(&pids);
    let py_latency = python(
        &client_path,
        &cfg(args.requests, WARM_REQUESTS, "/hello.txt", 10),
    )?;
    let py_latency_load = load.end();

    eprintln!(
        "egress_bench: latency, curl: {} requests per route",
        args.requests
    );
    let load = Load::start(&pids);
    let curl_latency = curl.rounds(&curl_routes, args.requests, WARM_REQUESTS, "/hello.txt", 10)?;
    let curl_latency_load = load.end();

    eprintln!(
        "egress_bench: throughput, Python: {} downloads of {} MiB per route",
        args.downloads,
        big >> 20
    );
    let load = Load::start(&pids);
    let py_download = python(&client_path, &cfg(args.downloads, 1, "/big", big))?;
    let py_download_load = load.end();

    eprintln!(
        "egress_bench: throughput, curl: {} downloads per route",
        args.downloads
    );
    let load = Load::start(&pids);
    let curl_download = curl.rounds(&curl_routes, args.downloads, 1, "/big", big)?;
    let curl_download_load = load.end();
    let measured = started.elapsed();

    // Every proxied request went through the broker (one allowed receipt each, closed), and
    // every request reached the server on a connection of its own.
    let finished = broker.finish();
    let receipts = &finished.egress;
    let odd = receipts.iter().find(|r| {
        r.verdict != "allowed" || r.kind != "connect" || r.ended.as_deref() != Some("closed")
    });
    if receipts.len() as u64 != args.proxied() || odd.is_some() {
        return Err(format!(
            "expected {} allowed and closed receipts, the broker listed {} (first odd one: {odd:?})",
            args.proxied(),
            receipts.len(),
        ));
    }
    let down: u64 = receipts.iter().map(|r| r.bytes_down).sum();
    let accepted = fixture.connections("files");
    if accepted != args.served() {
        return Err(format!(
            "the files server accepted {accepted} connections, not {}",
            args.served()
        ));
    }
    drop(fixture);

    // The report: data to stdout.
    let python_version = py_latency["python"].as_str().unwrap_or("?");
    let openssl = py_latency["openssl"].as_str().unwrap_or("?");
    println!("# Egress through the broker, on loopback");
    println!();
    facts.print();
    println!(
        "- clients: Python {python_version} http.client ({openssl}), one process per phase; \
         {curl_version}, one process per request"
    );
    println!(
        "- server: scripts/egress-fixture's files server (Python, threaded, TLS 1.3), as the \
         tests run it"
    );
    println!(
        "- routes: direct = client → server; broker = client → Unix socket (the egress hello) → \
         broker → server; relay+broker = client → TCP relay (a copy of the agent's) → Unix \
         socket → broker → server, what code in a sandbox gets. TCP_NODELAY on every hop: the \
         server and the relay on the connections they accept, the broker upstream"
    );
    println!(
        "- checked: {} receipts, every one allowed and closed ({:.0} MB down through the \
         broker); the server accepted exactly one connection per request ({accepted})",
        receipts.len(),
        down as f64 / 1e6
    );
    println!(
        "- measured in {:.0} s (setup and checks apart)",
        measured.as_secs_f64()
    );
    println!();

    println!(
        "## Latency: GET /hello.txt (10 bytes), each on a fresh connection with a full TLS \
         handshake, {} per route, rotated round-robin",
        args.requests
    );
    println!();
    println!(
        "| client | route | n | setup p50 ms | p50 ms | p90 ms | added p50 ms | p50 × direct |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let py = |line: &Value| -> Result<Vec<Series>, String> {
        cases
            .iter()
            .map(|c| {
                Ok(Series {
                    route: c.route,
                    setup: Some(samples(&line["setup"], c.route)?),
                    total: samples(&line["total"], c.route)?,
                })
            })
            .collect()
    };
    latency_rows("Python http.client", &py(&py_latency)?);
    latency_rows("curl, its time_total", &curl_latency.series(false));
    latency_rows(
        "curl, wall (process start and exit too)",
        &curl_latency.series(true),
    );
    println!();
    println!(
        "setup: until the TLS handshake is done (TCP connect, the CONNECT where proxied, the \
         handshake; curl's time_appconnect).\n\nLoad: during Python's part \
         {py_latency_load}; during curl's {curl_latency_load}."
    );
    println!();

    println!(
        "## Throughput: GET /big ({} MiB), one connection each, {} per route, rotated round-robin",
        big >> 20,
        args.downloads
    );
    println!();
    println!("| client | route | n | median MB/s | min MB/s | max MB/s | median × direct |");
    println!("|---|---|---|---|---|---|---|");
    throughput_rows("Python http.client", &py(&py_download)?, big);
    throughput_rows("curl, its time_total", &curl_download.series(false), big);
    println!();
    println!("Load: during Python's part {py_download_load}; during curl's {curl_download_load}.");
    println!();
    println!(
        "MB = 10^6 bytes. p50 is the median; \"added\" is the route's median minus direct's, by \
         the same client."
    );
    Ok(())
}

// --- the relay ------------------------------------------------------------------------------

/// The agent's relay (crates/agent/src/egress.rs, [`plimsoll_agent::egress::serve`]) on a
/// free loopback port instead of the fixed 3128 it takes inside a sandbox: TCP_NODELAY on each
/// accepted connection, a new channel connection per TCP connection opened with the egress
/// hello, then bytes both ways.
fn start_relay(socket: PathBuf) -> Result<u16, String> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| format!("cannot listen on loopback for the relay: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("the relay's port: {e}"))?
        .port();
    plimsoll_agent::egress::serve(listener, socket)
        .map_err(|e| format!("cannot start the relay's thread: {e}"))?;
    Ok(port)
}

// --- the clients ---------------------------------------------------------------------------

/// Runs the Python client for one phase; its JSON line.
fn python(script: &Path, cfg: &str) -> Result<Value, String> {
    let (ok, stdout, stderr) = output(Spawn::new(PYTHON, "/").arg(script).arg(cfg))?;
    if !ok {
        return Err(format!("the Python client failed: {stderr}"));
    }
    serde_json::from_slice(&stdout).map_err(|e| {
        format!(
            "the Python client said {:?}: {e}",
            String::from_utf8_lossy(&stdout)
        )
    })
}

/// One case's samples (ms) from the client's line.
fn samples(v: &Value, name: &str) -> Result<Vec<f64>, String> {
    v[name]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_f64).collect())
        .ok_or_else(|| format!("the Python client gave no samples for {name}"))
}

/// Starts a child, waits for it; whether it succeeded, its stdout and its stderr.
fn output(spawn: Spawn) -> Result<(bool, Vec<u8>, String), String> {
    let mut running = spawn.spawn().map_err(|e| match e.source() {
        Some(why) => format!("{e}: {why}"),
        None => e.to_string(),
    })?;
    let mut stderr = running.stderr;
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut stdout = Vec::new();
    let _ = running.stdout.read_to_end(&mut stdout);
    let status = running
        .child
        .wait()
        .map_err(|e| format!("cannot wait for a child: {e}"))?;
    let stderr = errs.join().unwrap_or_default();
    Ok((status.success(), stdout, stderr))
}

fn version_line(program: &str, flag: &str) -> Result<String, String> {
    let (_, out, _) = output(Spawn::new(program, "/").arg(flag))?;
    // "curl 7.88.1 (x86_64-pc-linux-gnu) libcurl/7.88.1 OpenSSL/3.0.19 ...": the version
    // and its TLS library.
    let out = String::from_utf8_lossy(&out);
    let line = out.lines().next().unwrap_or("?");
    let words: Vec<&str> = line.split_whitespace().collect();
    let tls = words
        .iter()
        .find(|w| w.starts_with("OpenSSL/") || w.starts_with("GnuTLS/"))
        .map_or(String::new(), |w| format!(" ({w})"));
    Ok(format!("{}{tls}", words[..words.len().min(2)].join(" ")))
}

struct Curl<'a> {
    ca: &'a str,
    port: u16,
    /// The relay's port, for the relay+broker route.
    relay: u16,
}

/// curl's samples per route: its own `time_appconnect` and `time_total`, and the wall time
/// around the process.
struct CurlSamples {
    routes: Vec<&'static str>,
    setup: Vec<Vec<f64>>,
    total: Vec<Vec<f64>>,
    wall: Vec<Vec<f64>>,
}

impl CurlSamples {
    /// Per route: curl's own figures, or the wall time around the process.
    fn series(&self, wall: bool) -> Vec<Series> {
        (0..self.routes.len())
            .map(|i| Series {
                route: self.routes[i],
                setup: (!wall).then(|| self.setup[i].clone()),
                total: if wall {
                    self.wall[i].clone()
                } else {
                    self.total[i].clone()
                },
            })
            .collect()
    }
}

impl Curl<'_> {
    /// `rounds` requests per route after `warm` untimed ones, the order rotated each round.
    fn rounds(
        &self,
        routes: &[&'static str],
        rounds: u32,
        warm: u32,
        path: &str,
        size: u64,
    ) -> Result<CurlSamples, String> {
        let mut s = CurlSamples {
            routes: routes.to_vec(),
            setup: vec![Vec::new(); routes.len()],
            total: vec![Vec::new(); routes.len()],
            wall: vec![Vec::new(); routes.len()],
        };
        for i in 0..(warm + rounds) as usize {
            for j in 0..routes.len() {
                let r = (i + j) % routes.len();
                let (setup, total, wall) = self.fetch(routes[r], path, size)?;
                if i >= warm as usize {
                    s.setup[r].push(setup);
                    s.total[r].push(total);
                    s.wall[r].push(wall);
                }
            }
        }
        Ok(s)
    }

    /// One request in its own curl process: (time_appconnect, time_total, wall), in ms.
    fn fetch(&self, route: &str, path: &str, size: u64) -> Result<(f64, f64, f64), String> {
        let url = format!("https://{HOST}:{}{path}", self.port);
        let mut spawn = Spawn::new(CURL, "/")
            .args(["-q", "-sS", "-o", "/dev/null", "--cacert", self.ca])
            .args([
                "-w",
                "%{http_code} %{size_download} %{time_appconnect} %{time_total}",
            ]);
        spawn = match route {
            "direct" => spawn
                .arg("--noproxy")
                .arg("*")
                .arg("--resolve")
                .arg(format!("{HOST}:{}:127.0.0.1", self.port)),
            RELAY => spawn
                .arg("--proxy")
                .arg(format!("http://127.0.0.1:{}", self.relay)),
            _ => return Err(format!("curl has no route {route}")),
        };
        let t = Instant::now();
        let (ok, out, err) = output(spawn.arg(&url))?;
        let wall = t.elapsed().as_secs_f64() * 1e3;
        let out = String::from_utf8_lossy(&out);
        let f: Vec<&str> = out.split_whitespace().collect();
        let want = size.to_string();
        if !ok || f.len() != 4 || f[0] != "200" || f[1] != want {
            return Err(format!("curl {route} {url}: printed {out:?}, said {err:?}"));
        }
        let secs = |s: &str| {
            s.parse::<f64>()
                .map(|v| v * 1e3)
                .map_err(|_| format!("curl printed {s:?} for a time"))
        };
        Ok((secs(f[2])?, secs(f[3])?, wall))
    }
}

// --- figures ---------------------------------------------------------------------------------

/// The median (the mean of the middle two for an even count) and the 90th percentile (nearest
/// rank), as `plimsoll bench` computes them.
fn median_p90(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    let rank = (n * 9).div_ceil(10);
    (median, s[rank.clamp(1, n) - 1])
}

/// One route's samples, in ms: until the TLS handshake was done (when known), and in all.
struct Series {
    route: &'static str,
    setup: Option<Vec<f64>>,
    total: Vec<f64>,
}

/// The rows of one client; the first series is the direct route.
fn latency_rows(client: &str, series: &[Series]) {
    let (direct, _) = median_p90(&series[0].total);
    for s in series {
        let (p50, p90) = median_p90(&s.total);
        let setup = s
            .setup
            .as_ref()
            .map_or("-".to_owned(), |v| format!("{:.2}", median_p90(v).0));
        let (added, ratio) = if s.route == "direct" {
            ("-".to_owned(), "-".to_owned())
        } else {
            (
                format!("{:+.2}", p50 - direct),
                format!("{:.2}", p50 / direct),
            )
        };
        println!(
            "| {client} | {} | {} | {setup} | {p50:.2} | {p90:.2} | {added} | {ratio} |",
            s.route,
            s.total.len()
        );
    }
}

/// The rows of one client; the first series is the direct route.
fn throughput_rows(client: &str, series: &[Series], bytes: u64) {
    let rate = |ms: f64| bytes as f64 / 1e6 / (ms / 1e3);
    let (direct, _) = median_p90(&series[0].total);
    for s in series {
        let (median, _) = median_p90(&s.total);
        let slowest = s.total.iter().copied().fold(f64::MIN, f64::max);
        let fastest = s.total.iter().copied().fold(f64::MAX, f64::min);
        let ratio = if s.route == "direct" {
            "-".to_owned()
        } else {
            format!("{:.2}", rate(median) / rate(direct))
        };
        println!(
            "| {client} | {} | {} | {:.0} | {:.0} | {:.0} | {ratio} |",
            s.route,
            s.total.len(),
            rate(median),
            rate(slowest),
            rate(fastest)
        );
    }
}

// --- the host --------------------------------------------------------------------------------

struct HostFacts {
    cores: usize,
    model: String,
    kernel: String,
    loadavg: String,
}

impl HostFacts {
    fn gather() -> HostFacts {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        HostFacts {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
                .unwrap_or_else(|| "?".into()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "?".into()),
            loadavg: std::fs::read_to_string("/proc/loadavg")
                .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|_| "?".into()),
        }
    }

    fn print(&self) {
        println!(
            "- host: {} cores ({}), Linux {}, load average {} at the start; the client, the \
             server, the broker and the relay share these cores, nothing pinned",
            self.cores, self.model, self.kernel, self.loadavg
        );
        println!(
            "- build: {}",
            if cfg!(debug_assertions) {
                "debug (NOT the shipped build: run with --release for figures to quote)"
            } else {
                "release"
            }
        );
    }
}

/// Clock ticks of /proc (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// CPU time the whole host spent, and what this bench's processes spent, over one phase.
struct Load {
    fixture_pids: Vec<u32>,
    started: Instant,
    host: u64,
    ours: u64,
    fixture: u64,
    procs: HashMap<u32, (String, u64)>,
}

impl Load {
    fn start(fixture_pids: &[u32]) -> Load {
        Load {
            fixture_pids: fixture_pids.to_vec(),
            started: Instant::now(),
            host: host_busy(),
            ours: proc_ticks("self", true).map_or(0, |(_, t)| t),
            fixture: ticks_of(fixture_pids),
            procs: processes(),
        }
    }

    /// "the host's CPUs busy X CPU-s of Y s × N cores, the bench's processes W of it (its
    /// children and the fixtures too), others ≈ X − W; busiest others: a 0.3 s, b 0.1 s", the
    /// latter among processes still running at the end, by their own CPU time. /proc/stat
    /// samples ticks, /proc/PID/stat sums exact run time: the difference is rough near zero.
    fn end(self) -> String {
        let wall = self.started.elapsed().as_secs_f64();
        let host = host_busy().saturating_sub(self.host);
        let ours = proc_ticks("self", true)
            .map_or(0, |(_, t)| t)
            .saturating_sub(self.ours);
        let fixture = ticks_of(&self.fixture_pids).saturating_sub(self.fixture);
        let (host, bench) = (host as f64 / TICKS, (ours + fixture) as f64 / TICKS);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let me = std::process::id();
        let mut by_name: HashMap<String, u64> = HashMap::new();
        for (pid, (name, t)) in processes() {
            if pid == me || self.fixture_pids.contains(&pid) {
                continue;
            }
            let before = self.procs.get(&pid).map_or(0, |(_, b)| *b);
            *by_name.entry(name).or_default() += t.saturating_sub(before);
        }
        let mut top: Vec<(String, u64)> = by_name.into_iter().filter(|(_, t)| *t >= 5).collect();
        top.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
        let top: Vec<String> = top
            .iter()
            .take(3)
            .map(|(n, t)| format!("{n} {:.1} s", *t as f64 / TICKS))
            .collect();
        format!(
            "the host's CPUs were busy {host:.1} CPU-s of {wall:.1} s × {cores} cores, the \
             bench's processes {bench:.1} of it, others ≈ {:.1}{}",
            (host - bench).max(0.0),
            if top.is_empty() {
                String::new()
            } else {
                format!(" (busiest: {})", top.join(", "))
            }
        )
    }
}

/// Ticks the host's CPUs spent busy, from /proc/stat.
fn host_busy() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    [0, 1, 2, 5, 6, 7].iter().filter_map(|i| f.get(*i)).sum()
}

/// The CPU ticks of these processes.
fn ticks_of(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| proc_ticks(&p.to_string(), true))
        .map(|(_, t)| t)
        .sum()
}

/// A process's name and its CPU ticks, with its reaped children's when `children`.
fn proc_ticks(pid: &str, children: bool) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat[open + 1..close].to_owned();
    // After the name: state is field 3; utime, stime, cutime, cstime are fields 14 to 17.
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let fields = if children { 11..15 } else { 11..13 };
    let t = fields.filter_map(|i| f.get(i)?.parse::<u64>().ok()).sum();
    Some((name, t))
}

/// Every process this one can see, with its own ticks.
fn processes() -> HashMap<u32, (String, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(|e| {
        let name = e.ok()?.file_name();
        let pid: u32 = name.to_str()?.parse().ok()?;
        Some((pid, proc_ticks(&pid.to_string(), false)?))
    })
    .collect()
}
