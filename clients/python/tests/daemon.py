"""A real plimsolld for the tests, as a child process: the repository's target/debug/plimsolld,
a loopback port chosen by the daemon, a fresh state directory and callers file, its own
sandbox uid range, its log in a file; restarted (SIGTERM, then the same daemon again on the
same address) when a test asks; stopped (SIGTERM, then SIGKILL) at the end."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[3]
PLIMSOLLD = REPO / "target" / "debug" / "plimsolld"
ROUTER = REPO / "target" / "debug" / "plimsoll-router"
# PLIMSOLL_TEST_ROUTER=1: every daemon is reached through a plimsoll-router in front of it
# (docs/cluster.md), so the whole suite checks that the router passes answers on untouched.
THROUGH_ROUTER = os.environ.get("PLIMSOLL_TEST_ROUTER") == "1"
# The real path: the oci provider refuses an image reached through a symlink.
IMAGE = (REPO / "build" / "images" / "sandbox").resolve()

LISTEN_TIMEOUT_S = 60
READY_TIMEOUT_S = 180
STOP_TIMEOUT_S = 30
UIDS_PER_PORT = 1024


def strict() -> bool:
    """CI=true (or 1): every skip is a failure, so a broken setup cannot pass quietly."""
    return os.environ.get("CI") in ("true", "1")


def skip_or_fail(test: str, reason: str) -> None:
    """Prints ``SKIP <test>: <reason>`` and skips, or fails under CI=true."""
    if strict():
        pytest.fail(f"SKIP not allowed under CI=true: {test}: {reason}", pytrace=False)
    print(f"SKIP {test}: {reason}")
    pytest.skip(reason)


def uid_base_for_port(port: int) -> int:
    """The sandbox uid range of a daemon whose test holds this loopback port bound: the same
    rule as plimsoll_daemon::testing, so no two test daemons on the host share a uid (the end
    of a run kills every process of its uids)."""
    return 1_000_000_000 + port * UIDS_PER_PORT


def add_caller(callers: Path, name: str) -> str:
    """Appends a caller to a callers file (only the token's SHA-256 is written) and returns
    the token, shaped as `plimsoll callers add` makes them."""
    token = "plm_" + secrets.token_urlsafe(32)
    digest = hashlib.sha256(token.encode()).hexdigest()
    with open(callers, "a") as f:
        f.write(f'\n[[caller]]\nname = "{name}"\ntoken_sha256 = "{digest}"\n')
    os.chmod(callers, 0o600)
    return token


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # If the test process dies, the daemon gets SIGTERM rather than living on.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass
class Daemon:
    url: str
    token: str
    caller: str
    log: Path
    dir: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    uid_port: socket.socket = field(repr=False)
    # With PLIMSOLL_TEST_ROUTER=1: the router in front (``url`` is then the router's) and the
    # daemon's own address.
    router: Optional[subprocess.Popen[bytes]] = field(default=None, repr=False)
    node_url: str = ""
    # What it was started with: its settings file and environment (a restart reuses them).
    config: Optional[Path] = None
    env: dict[str, str] = field(default_factory=dict, repr=False)
    starts: int = 1

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def restart(self) -> int:
        """SIGTERM, then the same daemon started again on the same settings, state directory
        and address (so clients, and the router in front, find it where it was), ready once
        it has restored what the stopped one saved; with a router, once the router has
        learnt it. Returns the stopped daemon's exit status."""
        assert self.config is not None and self.node_url
        self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(STOP_TIMEOUT_S)
        listen = self.node_url.removeprefix("http://")
        self.starts += 1
        self.log = self.dir / f"plimsolld.{self.starts}.log"
        self.process = _launch(self.config, listen, self.env, self.log, self.dir)
        if _wait_listening(self) != listen:
            raise RuntimeError(f"plimsolld came back elsewhere than {listen}")
        _wait_probed(self, self.node_url)
        if self.router is not None:
            _wait_router_learnt(self)
        return status

    def stop(self) -> None:
        if self.router is not None and self.router.poll() is None:
            self.router.kill()
            self.router.wait()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"plimsolld did not stop within {STOP_TIMEOUT_S} s of SIGTERM; killing it")
                self.process.kill()
                self.process.wait()
        self.uid_port.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_daemon(
    test: str,
    providers: list[str],
    *,
    extra_settings: str = "",
    daemon_settings: str = "",
    env: Optional[dict[str, str]] = None,
    caller: str = "pytest",
    max_per_caller: int = 4,
    max_concurrent: int = 4,
) -> Daemon:
    """Starts plimsolld and waits until every provider is probed. Skips (fails under CI=true)
    when the binary is missing or this process is not root."""
    if not PLIMSOLLD.is_file():
        skip_or_fail(test, f"no plimsolld at {PLIMSOLLD}: build it first (`make build`)")
    if os.geteuid() != 0:
        skip_or_fail(test, "running sandboxes needs root (plimsolld switches to sandbox uids)")
    d = Path(tempfile.mkdtemp(prefix="plimsoll-pyclient-"))
    # Sandbox uids must traverse it to reach their run directories under state/.
    os.chmod(d, 0o711)
    state = d / "state"
    state.mkdir()
    callers = d / "callers.toml"
    token = add_caller(callers, caller)
    uid_port = socket.socket()
    uid_port.bind(("127.0.0.1", 0))
    uid_base = uid_base_for_port(uid_port.getsockname()[1])
    config = d / "plimsoll.toml"
    config.write_text(
        f"providers = {json.dumps(providers)}\n"
        'default_floor = "container"\n'
        f"state_dir = {_toml_str(str(state))}\n"
        f"sandbox_uid_base = {uid_base}\n"
        f"max_concurrent = {max_concurrent}\nmax_per_caller = {max_per_caller}\n"
        f"{extra_settings}\n"
        f"[oci]\nimage = {_toml_str(str(IMAGE))}\n\n"
        f"[daemon]\ncallers_file = {_toml_str(str(callers))}\n{daemon_settings}\n"
    )
    log = d / "plimsolld.log"
    child_env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PLIMSOLL_LOG": "info",
        **(env or {}),
    }
    process = _launch(config, "127.0.0.1:0", child_env, log, d)
    daemon = Daemon(
        url="", token=token, caller=caller, log=log, dir=d, process=process, uid_port=uid_port,
        config=config, env=child_env,
    )
    try:
        daemon.url = "http://" + _wait_listening(daemon)
        daemon.node_url = daemon.url
        _wait_probed(daemon, daemon.url)
        if THROUGH_ROUTER:
            _start_router(daemon, callers, child_env)
    except BaseException:
        daemon.stop()
        raise
    return daemon


def _launch(
    config: Path, listen: str, env: dict[str, str], log: Path, cwd: Path
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as log_file:
        return subprocess.Popen(
            [str(PLIMSOLLD), "--config", str(config), "--listen", listen],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            preexec_fn=_die_with_parent,
        )


def _start_router(d: Daemon, callers: Path, env: dict[str, str]) -> None:
    """Puts a plimsoll-router in front of the daemon: its own caller in the same callers file,
    learning the daemon every 200 ms; ``d.url`` becomes the router's once it can place runs."""
    if not ROUTER.is_file():
        raise RuntimeError(f"no plimsoll-router at {ROUTER}: build it first (`make build`)")
    token_file = d.dir / "router.token"
    token_file.write_text(add_caller(callers, "router"))
    log = d.dir / "router.log"
    with open(log, "wb") as log_file:
        d.router = subprocess.Popen(
            [str(ROUTER), "--listen", "127.0.0.1:0", "--refresh-ms", "200",
             "--nodes", d.node_url.removeprefix("http://"),
             "--callers", str(callers), "--token-file", str(token_file)],
            env={"PATH": env["PATH"], "PLIMSOLL_LOG": "info"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            preexec_fn=_die_with_parent,
        )
    import httpx

    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    addr = None
    while time.monotonic() < deadline and addr is None:
        for line in log.read_text(errors="replace").splitlines():
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if v.get("message") == "listening":
                addr = v["addr"]
        if d.router.poll() is not None:
            raise RuntimeError(f"plimsoll-router exited: {_tail(log.read_text(errors='replace'))}")
        time.sleep(0.05)
    if addr is None:
        raise RuntimeError("plimsoll-router did not start listening")
    url = f"http://{addr}"
    with httpx.Client(trust_env=False) as http:
        while time.monotonic() < deadline:
            if http.get(f"{url}/readyz", timeout=5).status_code == 200:
                d.url = url
                return
            time.sleep(0.05)
    # A daemon with no provider is never usable: its tests reach it directly.
    d.url = url


def _tail(text: str, n: int = 20) -> str:
    return "\n".join(text.splitlines()[-n:])


def _check_alive(d: Daemon) -> None:
    if d.process.poll() is not None:
        raise RuntimeError(
            f"plimsolld exited ({d.process.returncode}) before it was ready; the end of its "
            f"log:\n{_tail(d.log_text())}"
        )


def _wait_listening(d: Daemon) -> str:
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in d.log_text().splitlines():
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if v.get("message") == "listening" and isinstance(v.get("addr"), str):
                return v["addr"]
        _check_alive(d)
        time.sleep(0.05)
    raise RuntimeError(f"plimsolld did not start listening within {LISTEN_TIMEOUT_S} s")


def _wait_probed(d: Daemon, url: str) -> None:
    import httpx

    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(trust_env=False) as http:
        while time.monotonic() < deadline:
            try:
                if http.get(f"{url}/readyz", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if "no provider passed its probe" in d.log_text():
                return
            _check_alive(d)
            time.sleep(0.1)
    raise RuntimeError(f"plimsolld probed its providers for more than {READY_TIMEOUT_S} s")


def _wait_router_learnt(d: Daemon) -> None:
    """Waits until the router in front has learnt the daemon as it is now (its instance, and
    usable: a daemon is ready only once it restored what an earlier one saved, so the router
    then knows the instances it adopted too)."""
    import httpx

    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    with httpx.Client(trust_env=False) as http:
        instance = http.get(f"{d.node_url}/readyz", timeout=5).headers["plimsoll-instance"]
        node = d.node_url.removeprefix("http://")
        nodes: object = None
        while time.monotonic() < deadline:
            a = http.get(f"{d.url}/v1/nodes", headers={"authorization": f"Bearer {d.token}"}, timeout=5)
            nodes = a.json().get("nodes") if a.status_code == 200 else a.text
            if isinstance(nodes, list) and any(
                n.get("node") == node and n.get("instance") == instance and n.get("usable")
                for n in nodes
            ):
                return
            time.sleep(0.05)
    raise RuntimeError(f"the router never learnt {node} as instance {instance}: {nodes}")
