"""plimsoll's MCP server, checked with clients no one here wrote.

The official Python MCP SDK talks to `plimsoll mcp` over stdio and to a real plimsolld over
streamable HTTP at /mcp; the MCP Inspector's CLI mode does the same from node. Each lists the
tools, calls each one, and sees a refusal (a floor of `vm`: not dispatched) and a timeout;
over HTTP a missing or a wrong token is refused with 401 and nothing runs.

Run by `make mcp` (scripts/mcp-test-env installs the clients first), with
build/mcp/venv/bin/python. Providers `process` and `crun`. Under CI=true nothing may skip.
Prints one line per check and closes with `N passed, N failed`.
"""

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "target" / "debug"
PLIMSOLL = TARGET / "plimsoll"
PLIMSOLLD = TARGET / "plimsolld"
INSPECTOR = ROOT / "tests" / "mcp" / "inspector" / "node_modules" / ".bin" / "mcp-inspector"
CI = os.environ.get("CI") in ("true", "1")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
# Sandbox uids: above every range the Rust tests derive from ports (1e9 + port * 1024), and
# derived from a port this process holds, so two runs at once never share one.
UID_BASE = 1_100_000_000
# Each engine of this suite (stdio, the daemon, the inspector's stdio) gets its own uids: with
# max_concurrent 4 and two providers an engine uses base..base+2*4+2-1 (10 uids); 32 apart.
UIDS_PER_INSTANCE = 32
UIDS_PER_PORT = 1024

results = {"passed": 0, "failed": 0}
# What the SDK saw, one real call per tool: printed at the end for the record.
seen = {}


def check(name, fn):
    try:
        fn()
    except Exception:  # noqa: BLE001 - every failure is reported, then counted
        results["failed"] += 1
        print(f"FAIL {name}")
        traceback.print_exc()
    else:
        results["passed"] += 1
        print(f"ok   {name}")


def held_port():
    """A loopback port bound (and held) by this process: a unique id while held."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


def clean_env(**extra):
    """The environment for child processes: only what they need (NODE_EXTRA_CA_CERTS and
    the like are not the project's)."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    if "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    env.update(extra)
    return env


def settings(dir_, uid_base, listen=None, callers=None):
    text = f"""providers = ["process", "crun"]
state_dir = "{dir_}/state"
sandbox_uid_base = {uid_base}
max_concurrent = 4

[oci]
# The real path: the image refuses to be reached through a symlink (build/ may be one).
image = "{(ROOT / 'build/images/sandbox').resolve()}"
"""
    if listen:
        text += f'\n[daemon]\nlisten = "{listen}"\ncallers_file = "{callers}"\n'
    (Path(dir_) / "state").mkdir(exist_ok=True)
    os.chmod(dir_, 0o711)
    path = Path(dir_) / "plimsoll.toml"
    path.write_text(text)
    return path


def text_of(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


# --- the checks, shared by both transports -------------------------------------------------


async def exercise(session, label, strict_tier):
    """Every tool, a refusal and a timeout through one connected SDK session."""
    await session.initialize()
    tools = (await session.list_tools()).tools
    by_name = {t.name: t for t in tools}
    seen.setdefault("tools/list", [t.name for t in tools])

    def tool_list():
        assert set(by_name) == {"run_code", "run_project", "list_providers"}, by_name
        props = by_name["run_code"].input_schema["properties"]
        for p in ["language", "code", "min_isolation", "provider", "timeout_ms", "grant"]:
            assert p in props, (p, props)
        for p in ["files", "steps", "artifacts"]:
            assert p in by_name["run_project"].input_schema["properties"], p
        schema = json.dumps(by_name["run_code"].input_schema)
        assert "not dispatched" in schema and "floor" in schema, schema
        assert "not dispatched" in by_name["run_code"].description

    check(f"{label}: tools/list names the three tools with schemas a model can act on", tool_list)

    r = await session.call_tool(
        "run_code",
        {"language": "python", "code": "print('hello from python')", "min_isolation": "process", "provider": "process"},
    )
    seen.setdefault("run_code", (r.structured_content, text_of(r)))

    def ran_python():
        assert not r.is_error, text_of(r)
        s = r.structured_content
        assert s["status"] == "ran"
        assert s["provider"] == "process" and s["isolation"] == "process", s
        assert s["exit_code"] == 0 and s["timed_out"] is False
        assert s["stdout"] == {
            "encoding": "utf-8",
            "text": "hello from python\n",
            "bytes": 18,
            "shown_bytes": 18,
            "truncated": False,
            "truncated_by_sandbox": False,
            "truncated_for_context": False,
        }, s["stdout"]
        for d in ["request_sha256", "result_sha256", "record_sha256"]:
            assert HEX64.match(s[d]), (d, s[d])
        rec = s["record"]
        assert rec["request_sha256"] == s["request_sha256"]
        assert rec["result_sha256"] == s["result_sha256"]
        assert rec["record_sha256"] == s["record_sha256"]
        assert rec["isolation"] == "process" and rec["request_id"] == s["request_id"]
        t = text_of(r)
        assert "isolation process" in t and "hello from python" in t and s["record_sha256"] in t, t

    check(f"{label}: run_code runs python at the process tier, with its digests", ran_python)

    r = await session.call_tool(
        "run_code", {"language": "javascript", "code": "console.log(6 * 7)", "min_isolation": "container", "provider": "crun"}
    )

    def ran_in_crun():
        s = r.structured_content
        if strict_tier:
            assert not r.is_error, text_of(r)
            assert s["provider"] == "crun" and s["isolation"] == "container", s
            assert s["stdout"]["text"] == "42\n", s["stdout"]
        else:
            assert r.is_error or s["isolation"] == "container", s

    check(f"{label}: run_code runs javascript in crun at the container tier", ran_in_crun)

    r = await session.call_tool("run_code", {"language": "python", "code": "print('never')", "min_isolation": "vm"})
    seen.setdefault("refusal", (r.structured_content, text_of(r)))

    def refused():
        assert r.is_error, text_of(r)
        t = text_of(r)
        assert t.startswith("not dispatched (isolation): nothing ran"), t
        assert "retry is safe" in t, t
        s = r.structured_content
        assert s["status"] == "not_dispatched" and s["reason"] == "isolation", s
        assert s["nothing_ran"] is True and s["retry_safe"] is True, s

    check(f"{label}: a floor of vm is refused: not dispatched, nothing ran", refused)

    r = await session.call_tool(
        "run_code",
        {"language": "python", "code": "import time\nprint('started', flush=True)\ntime.sleep(30)", "provider": "process",
         "min_isolation": "process", "timeout_ms": 700},
    )
    seen.setdefault("timeout", (r.structured_content, text_of(r)))

    def timed_out():
        assert not r.is_error, text_of(r)
        s = r.structured_content
        assert s["timed_out"] is True, s
        assert s["stdout"]["text"] == "started\n", s["stdout"]
        assert "timed out" in text_of(r)

    check(f"{label}: a run past timeout_ms is a result with timed_out true", timed_out)

    r = await session.call_tool(
        "run_code",
        {"language": "python", "provider": "process", "min_isolation": "process",
         "code": "import sys\nsys.stdout.buffer.write(b'\\xff\\x00ok')\nsys.stderr.write('x' * 70000)"},
    )

    def bytes_and_caps():
        s = r.structured_content
        assert s["stdout"]["encoding"] == "base64", s["stdout"]
        import base64

        assert base64.b64decode(s["stdout"]["base64"]) == b"\xff\x00ok"
        e = s["stderr"]
        assert e["bytes"] == 70000 and e["shown_bytes"] == 65536, e
        assert e["truncated"] is True and e["truncated_for_context"] is True, e
        assert e["text"] == "x" * 65536

    check(f"{label}: non-UTF-8 stdout comes back exactly; stderr is capped at 64 KiB, flagged", bytes_and_caps)

    r = await session.call_tool(
        "run_project",
        {
            "files": [{"path": "src/main.py", "content": "print(sum(range(10)))\n"}],
            "steps": [
                {"name": "run", "run": "python3 src/main.py > out.txt && cat out.txt"},
                {"name": "count", "run": "wc -c < out.txt"},
            ],
            "artifacts": ["out.txt", "missing.txt"],
            "min_isolation": "container",
            "provider": "crun",
        },
    )
    seen.setdefault("run_project", (r.structured_content, text_of(r)))

    def project():
        if not strict_tier and r.is_error:
            return
        assert not r.is_error, text_of(r)
        s = r.structured_content
        assert s["provider"] == "crun" and s["isolation"] == "container", s
        assert [st["name"] for st in s["steps"]] == ["run", "count"], s["steps"]
        assert s["steps"][0]["stdout"]["text"] == "45\n", s["steps"][0]
        assert s["steps"][1]["stdout"]["text"].strip() == "3", s["steps"][1]
        out, missing = s["artifacts"]
        assert out["path"] == "out.txt" and out["found"] is True and out["text"] == "45\n", out
        assert missing["found"] is False, missing

    check(f"{label}: run_project writes files, runs steps in order, returns artifacts", project)

    r = await session.call_tool("list_providers", {})
    seen.setdefault("list_providers", (r.structured_content, text_of(r)))

    def providers():
        assert not r.is_error, text_of(r)
        s = r.structured_content
        names = {p["name"]: p for p in s["providers"]}
        assert set(names) == {"process", "crun"}, names
        assert names["process"]["isolation"] == "process" and names["process"]["available"] is True
        assert names["crun"]["isolation"] == "container"
        if strict_tier:
            assert names["crun"]["available"] is True, names["crun"]
        assert s["default_floor"] == "container"
        assert "default floor: container" in text_of(r)

    check(f"{label}: list_providers lists process and crun with their tiers", providers)


# --- transports ----------------------------------------------------------------------------


def crun_usable():
    return os.geteuid() == 0 and shutil.which("crun") is not None and (ROOT / "build/images/sandbox/rootfs").is_dir()


async def over_stdio(tmp, uid_base, strict_tier):
    cfg = settings(tmp, uid_base)
    params = StdioServerParameters(command=str(PLIMSOLL), args=["mcp", "--config", str(cfg)], env=clean_env())
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await exercise(session, "python sdk, stdio", strict_tier)


class Daemon:
    """A real plimsolld as a child process, with one caller."""

    def __init__(self, tmp, uid_base, port):
        self.callers = Path(tmp) / "callers.toml"
        out = subprocess.run(
            [str(PLIMSOLL), "callers", "add", "mcp-test", "--file", str(self.callers)],
            check=True, capture_output=True, text=True, env=clean_env(),
        )
        self.token = out.stdout.strip()
        cfg = settings(tmp, uid_base, listen=f"127.0.0.1:{port}", callers=self.callers)
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(Path(tmp) / "plimsolld.log", "w")
        self.proc = subprocess.Popen([str(PLIMSOLLD), "--config", str(cfg)], stdout=self.log, stderr=self.log, env=clean_env())
        try:
            deadline = time.time() + 120
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"plimsolld exited: {(Path(tmp) / 'plimsolld.log').read_text()}")
                try:
                    if httpx2.get(self.url + "/readyz", timeout=2).status_code == 200:
                        return
                except httpx2.HTTPError:
                    pass
                time.sleep(0.2)
            raise RuntimeError("plimsolld did not become ready in 120 s")
        except BaseException:
            # Not ready: nobody else will stop it.
            self.stop()
            raise

    def runs_counted(self):
        text = httpx2.get(self.url + "/metrics", timeout=5).text
        total = 0
        for line in text.splitlines():
            if line.startswith("plimsoll_runs_total{"):
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


CALL = {
    "jsonrpc": "2.0", "id": 1, "method": "tools/call",
    "params": {"name": "run_code", "arguments": {"language": "python", "code": "print(1)", "provider": "process",
                                                  "min_isolation": "process"}},
}


async def over_http(daemon, strict_tier):
    mcp_url = daemon.url + "/mcp"
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {daemon.token}"}, timeout=120) as http:
        async with streamable_http_client(mcp_url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await exercise(session, "python sdk, streamable http", strict_tier)

    # `plimsoll mcp --daemon`: stdio in front, the Rust client (which verifies digests, the
    # request id and the tier) behind.
    params = StdioServerParameters(
        command=str(PLIMSOLL), args=["mcp", "--daemon", daemon.url], env=clean_env(PLIMSOLL_TOKEN=daemon.token)
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            ran = await session.call_tool(
                "run_code", {"language": "python", "code": "print('through the client')", "min_isolation": "process"}
            )
            refused = await session.call_tool("run_code", {"language": "python", "code": "print(1)", "min_isolation": "vm"})

    def via_client():
        assert not ran.is_error, text_of(ran)
        s = ran.structured_content
        assert s["stdout"]["text"] == "through the client\n" and s["isolation"] == "process", s
        assert HEX64.match(s["record_sha256"]), s
        assert refused.is_error and text_of(refused).startswith("not dispatched (isolation): nothing ran"), text_of(refused)

    check("python sdk, stdio with --daemon: runs through the Rust client, refusals marked", via_client)

    before = daemon.runs_counted()
    check("http: runs through /mcp are the daemon's runs (counted in its metrics)",
          lambda: expect(before >= 4, before))
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    no_token = httpx2.post(mcp_url, json=CALL, headers=headers, timeout=30)
    wrong = httpx2.post(mcp_url, json=CALL, headers=headers | {"Authorization": "Bearer plm_not-a-real-token"}, timeout=30)

    def refused_401():
        for resp in [no_token, wrong]:
            assert resp.status_code == 401, (resp.status_code, resp.text)
            assert resp.headers.get("www-authenticate") == "Bearer"
            body = resp.json()
            assert body["error"]["code"] == "unauthenticated" and body["error"]["not_dispatched"] == "permission", body
        assert daemon.runs_counted() == before, "a refused call ran or was counted as a run"

    check("http: a missing or wrong token is refused with 401, nothing run", refused_401)

    async def sdk_without_token():
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer plm_wrong"}, timeout=30) as http:
            async with streamable_http_client(mcp_url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()

    try:
        await asyncio.wait_for(sdk_without_token(), 60)
        sdk_error = None
    except BaseException as e:  # noqa: BLE001 - the SDK raises its own types or groups
        sdk_error = e

    def sdk_refused():
        assert sdk_error is not None, "the SDK connected with a wrong token"

    check("http: the SDK with a wrong token cannot even initialize", sdk_refused)

    big = httpx2.post(
        mcp_url, content=b"{" + b" " * (9 * 1024 * 1024) + b"}",
        headers=headers | {"Authorization": f"Bearer {daemon.token}"}, timeout=60,
    )
    check("http: a body over [daemon].max_body_bytes is refused with 413",
          lambda: expect(big.status_code == 413, big.status_code))


# --- the inspector -------------------------------------------------------------------------


def inspector(args, timeout=180):
    """The Inspector's CLI; one that does not end in `timeout` s is a failed run (returncode
    None), so the check fails and the suite goes on (and stops its daemon)."""
    try:
        return subprocess.run(
            ["node", str(INSPECTOR), "--cli", *args], capture_output=True, text=True, timeout=timeout,
            env=clean_env(), cwd=str(ROOT),
        )
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, None, e.stdout or "", f"timed out after {timeout} s")


def expect(condition, message):
    assert condition, message


def inspector_checks(label, target, strict_tier):
    listed = inspector([*target, "--method", "tools/list"])

    def tools():
        assert listed.returncode == 0, listed.stderr
        names = {t["name"] for t in json.loads(listed.stdout)["tools"]}
        assert names == {"run_code", "run_project", "list_providers"}, names

    check(f"{label}: tools/list", tools)

    def call(tool, *pairs):
        return inspector([*target, "--method", "tools/call", "--tool-name", tool, *sum((["--tool-arg", p] for p in pairs), [])])

    ran = call("run_code", "language=javascript", "code=console.log('hi from node')", "provider=process", "min_isolation=process")

    def run_code():
        assert ran.returncode == 0, ran.stderr
        r = json.loads(ran.stdout)
        assert r.get("isError") is not True, r
        assert r["structuredContent"]["stdout"]["text"] == "hi from node\n", r
        assert r["structuredContent"]["isolation"] == "process"

    check(f"{label}: run_code", run_code)

    project = call(
        "run_project", 'steps=[{"run": "echo built > out.txt"}]', 'artifacts=["out.txt"]', "provider=crun", "min_isolation=container"
    )

    def run_project():
        assert project.returncode == 0, project.stderr
        r = json.loads(project.stdout)
        if not strict_tier and r.get("isError"):
            return
        assert r.get("isError") is not True, r
        assert r["structuredContent"]["artifacts"][0]["text"] == "built\n", r
        assert r["structuredContent"]["isolation"] == "container", r

    check(f"{label}: run_project", run_project)

    refusal = call("run_code", "language=python", "code=print(1)", "min_isolation=vm")

    def refused():
        r = json.loads(refusal.stdout) if refusal.stdout.strip() else {}
        assert r.get("isError") is True, (refusal.returncode, refusal.stdout, refusal.stderr)
        assert r["content"][0]["text"].startswith("not dispatched (isolation): nothing ran"), r

    check(f"{label}: a floor of vm is refused (not dispatched)", refused)

    slow = call("run_code", "language=python", "code=import time; time.sleep(30)", "provider=process", "min_isolation=process",
                "timeout_ms=500")

    def timeout():
        assert slow.returncode == 0, slow.stderr
        assert json.loads(slow.stdout)["structuredContent"]["timed_out"] is True, slow.stdout

    check(f"{label}: timeout", timeout)

    provs = call("list_providers")

    def list_providers():
        assert provs.returncode == 0, provs.stderr
        names = {p["name"] for p in json.loads(provs.stdout)["structuredContent"]["providers"]}
        assert names == {"process", "crun"}, names

    check(f"{label}: list_providers", list_providers)
    return listed


def skip_or_fail(name, why):
    if CI:
        results["failed"] += 1
        print(f"FAIL {name}: {why} (CI=true: a skip is a failure)")
    else:
        print(f"SKIP {name}: {why}")


def main():
    for binary in [PLIMSOLL, PLIMSOLLD]:
        if not binary.exists():
            print(f"error: {binary} is missing: run `cargo build -p plimsoll-cli -p plimsoll-daemon` first", file=sys.stderr)
            return 2
    strict_tier = crun_usable()
    if not strict_tier:
        skip_or_fail("crun checks", "crun, root or build/images/sandbox is missing (run `make images` as root)")

    hold, port = held_port()
    uid_base = UID_BASE + port * UIDS_PER_PORT
    with tempfile.TemporaryDirectory(prefix="plimsoll-mcp-") as tmp:
        # Sandbox uids must traverse it to reach their run directories.
        os.chmod(tmp, 0o711)
        stdio_dir = Path(tmp) / "stdio"
        stdio_dir.mkdir()
        try:
            asyncio.run(over_stdio(str(stdio_dir), uid_base, strict_tier))
        except Exception:  # noqa: BLE001
            results["failed"] += 1
            print("FAIL python sdk, stdio: the session failed")
            traceback.print_exc()

        http_dir = Path(tmp) / "http"
        http_dir.mkdir()
        # The daemon's port: bound, released and handed to plimsolld (its uids come from the
        # port this process keeps holding, never from this one).
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        dport = probe.getsockname()[1]
        probe.close()
        daemon = None
        try:
            daemon = Daemon(str(http_dir), uid_base + UIDS_PER_INSTANCE, dport)
            asyncio.run(over_http(daemon, strict_tier))
        except Exception:  # noqa: BLE001
            results["failed"] += 1
            print("FAIL python sdk, streamable http: the session failed")
            traceback.print_exc()

        try:
            if not INSPECTOR.exists():
                skip_or_fail("inspector", f"{INSPECTOR} is missing: run scripts/mcp-test-env")
            else:
                insp_dir = Path(tmp) / "inspector"
                insp_dir.mkdir()
                cfg = settings(str(insp_dir), uid_base + 2 * UIDS_PER_INSTANCE, None)
                # The inspector takes --config for itself: the settings go by PLIMSOLL_CONFIG.
                inspector_checks("inspector, stdio", ["-e", f"PLIMSOLL_CONFIG={cfg}", str(PLIMSOLL), "mcp"], strict_tier)
                if daemon is not None:
                    inspector_checks(
                        "inspector, http",
                        [daemon.url + "/mcp", "--transport", "http", "--header", f"Authorization: Bearer {daemon.token}"],
                        strict_tier,
                    )
                    wrong = inspector([daemon.url + "/mcp", "--transport", "http", "--header",
                                       "Authorization: Bearer plm_wrong", "--method", "tools/list"], timeout=60)
                    check("inspector, http: a wrong token is refused",
                          lambda: expect(wrong.returncode not in (0, None), wrong.stdout + wrong.stderr))
        finally:
            # Whatever failed above, no daemon is left running.
            if daemon is not None:
                daemon.stop()
    hold.close()

    if os.environ.get("PLIMSOLL_MCP_SHOW"):
        print(json.dumps({k: v for k, v in seen.items()}, indent=2, default=str))
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 0 if results["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
