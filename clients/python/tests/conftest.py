"""Fixtures: one real plimsolld for the session (process and crun providers, a grant profile
in front of a real HTTP API on loopback), one keeping sessions at crun, one taking snapshots
at runsc, one at runsc for a test that restarts it, and clients of them."""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

# The package is tested from the checkout these tests sit in, first on the path (and on the
# path of the programs they start): the venv's editable install may point at another
# checkout of the repository (worktrees share build/), whose code would be tested instead.
SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(SRC)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
sys.path.insert(0, str(Path(__file__).parent))

from daemon import Daemon, skip_or_fail, start_daemon  # noqa: E402

import plimsoll  # noqa: E402

assert Path(plimsoll.__file__).resolve().is_relative_to(SRC), (
    f"plimsoll was imported from {plimsoll.__file__}, not from {SRC}"
)


@dataclass
class Api:
    """An operator's HTTP API: answers GET /orders/<id> and remembers what it was sent."""

    url: str
    secret: str
    seen: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture(scope="session")
def api() -> Iterator[Api]:
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            seen.append({"path": self.path, "authorization": self.headers.get("authorization")})
            body = json.dumps({"order": self.path.rsplit("/", 1)[-1], "item": "tea"}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    a = Api(url=f"http://127.0.0.1:{server.server_address[1]}", secret=secrets.token_hex(16))
    a.seen = seen
    yield a
    server.shutdown()
    server.server_close()


def _orders_profile(api: Api) -> str:
    """The API grant `orders` in front of ``api``, for caller pytest."""
    return (
        "[profiles.orders]\n"
        f'base_url = "{api.url}"\n'
        'routes = ["GET /orders/*"]\n'
        'callers = ["pytest"]\n'
        "call_budget = 5\n"
        "[profiles.orders.credential]\n"
        'kind = "static"\n'
        'secret_env = "PYCLIENT_ORDERS_TOKEN"\n'
    )


@pytest.fixture(scope="session")
def daemon(api: Api, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    grants = tmp_path_factory.mktemp("grants") / "grants.toml"
    grants.write_text(_orders_profile(api))
    d = start_daemon(
        "daemon",
        ["process", "crun"],
        extra_settings=f"grants_file = {json.dumps(str(grants))}",
        env={"PYCLIENT_ORDERS_TOKEN": api.secret},
    )
    yield d
    d.stop()


@pytest.fixture(scope="session")
def providers(daemon: Daemon) -> plimsoll.ProvidersResponse:
    with plimsoll.Client(daemon.url, daemon.token) as c:
        return c.providers()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[plimsoll.Client]:
    with plimsoll.Client(daemon.url, daemon.token) as c:
        yield c


def need_provider(
    request: pytest.FixtureRequest, providers: plimsoll.ProvidersResponse, name: str
) -> None:
    """Skips (fails under CI=true) when the daemon could not offer this provider."""
    p = providers.get(name)
    if p is None or not p.available:
        why = p.unavailable_reason if p is not None else "not configured"
        skip_or_fail(request.node.name, f"provider {name} is not available here: {why}")


@pytest.fixture
def container(request: pytest.FixtureRequest, providers: plimsoll.ProvidersResponse) -> None:
    need_provider(request, providers, "crun")


# Sessions (docs/sessions.md) are kept by crun: a daemon of its own offering crun alone, with
# no warm pools (each session holds one of its four uid slots for its life).
SESSION_SETTINGS = "[pools]\n[sessions]\nmax_total = 3\nmax_per_caller = 2\n"


# Sessions hold a grant for their whole life: the API grant `orders`, and the egress grant
# `pkgs`, which lists one host (a cell that asks for another is refused by the broker, before
# anything is resolved or connected: no network is needed).
EGRESS_PROFILE = '[egress.pkgs]\ncallers = ["pytest"]\nhosts = ["pypi.plimsoll.test"]\nports = [80]\n'


@pytest.fixture(scope="session")
def session_daemon(api: Api, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    grants = tmp_path_factory.mktemp("session-grants") / "grants.toml"
    grants.write_text(_orders_profile(api) + EGRESS_PROFILE)
    d = start_daemon(
        "session_daemon",
        ["crun"],
        extra_settings=f"grants_file = {json.dumps(str(grants))}\n{SESSION_SETTINGS}",
        env={"PYCLIENT_ORDERS_TOKEN": api.secret},
    )
    yield d
    d.stop()


@pytest.fixture
def sessions(request: pytest.FixtureRequest, session_daemon: Daemon) -> Daemon:
    """The sessions daemon, once it offers crun (skipped, or failed under CI=true, when not)."""
    with plimsoll.Client(session_daemon.url, session_daemon.token) as c:
        need_provider(request, c.providers(), "crun")
    return session_daemon


# Snapshots and forks (docs/sessions.md) are taken at runsc alone: a daemon of its own offering
# runsc, with no warm pools, and room for a session, a session restored from its snapshot and
# a fork of it into 4 (each an open session holding one of the daemon's uid slots).
SNAPSHOT_SETTINGS = "[pools]\n[sessions]\nmax_total = 8\nmax_per_caller = 8\n"


@pytest.fixture(scope="session")
def snapshot_daemon() -> Iterator[Daemon]:
    d = start_daemon(
        "snapshot_daemon",
        ["runsc"],
        extra_settings=SNAPSHOT_SETTINGS,
        max_concurrent=8,
        max_per_caller=8,
    )
    yield d
    d.stop()


@pytest.fixture
def snapshots(request: pytest.FixtureRequest, snapshot_daemon: Daemon) -> Daemon:
    """The snapshots daemon, once it offers runsc (skipped, or failed under CI=true, when
    not)."""
    with plimsoll.Client(snapshot_daemon.url, snapshot_daemon.token) as c:
        need_provider(request, c.providers(), "runsc")
    return snapshot_daemon


@pytest.fixture
def restartable(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """A daemon of this test's own at runsc, as the snapshots one, for a test that restarts
    it (skipped, or failed under CI=true, when runsc is not offered)."""
    d = start_daemon(
        request.node.name,
        ["runsc"],
        extra_settings=SNAPSHOT_SETTINGS,
        max_concurrent=8,
        max_per_caller=8,
    )
    try:
        with plimsoll.Client(d.url, d.token) as c:
            need_provider(request, c.providers(), "runsc")
        yield d
    finally:
        d.stop()
