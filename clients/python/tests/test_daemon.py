"""The sync client against a real plimsolld: runs at each tier the host has, projects with
exact bytes, limits, grants, providers, and refusals that ran nothing."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

import plimsoll
from plimsoll import File, Limits, Reason, Step, Tier, not_dispatched_reason

sys.path.insert(0, str(Path(__file__).parent))
from daemon import Daemon, start_daemon  # noqa: E402


def router_refusals(daemon: Daemon) -> float:
    """The router's count of requests it refused itself (0 with no router in front)."""
    if daemon.router is None:
        return 0.0
    text = httpx.get(f"{daemon.url}/metrics", trust_env=False).text
    return sum(float(l.split()[1]) for l in text.splitlines() if l.startswith("plimsoll_router_refused_total "))


def metrics(daemon: Daemon) -> dict[str, float]:
    """``GET /metrics`` as {series with labels: value}."""
    text = httpx.get(f"{daemon.node_url}/metrics", trust_env=False).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def runs_total(daemon: Daemon) -> float:
    return sum(v for k, v in metrics(daemon).items() if k.startswith("plimsoll_runs_total"))


def test_a_snippet_runs_at_the_process_tier_and_verifies(client: plimsoll.Client) -> None:
    for language, code in (("python", "print(6 * 7)"), ("javascript", "console.log(6 * 7)")):
        res = client.run_snippet(language, code, minimum_isolation="process", provider="process")
        assert res.stdout == b"42\n" and res.stdout.text() == "42\n"
        assert res.exit_code == 0 and res.result.signal is None and not res.result.timed_out
        assert res.isolation is Tier.PROCESS and res.provider == "process"
        assert re.fullmatch(r"[0-9a-f]{32}", res.request_id), res.request_id
        assert res.record.request_id == res.request_id
        # The request digest is over the body as sent, and the id is not part of it.
        assert res.request_sha256 == plimsoll.request_sha256(
            {"protocol": 1, "minimum_isolation": "process", "provider": "process",
             "run": {"kind": "snippet", "language": language, "code": code}}
        )
        assert b'"request_id":"' + res.request_id.encode() in res.request_body
    again = client.run_javascript("console.log(6 * 7)", minimum_isolation="process", provider="process")
    assert again.request_id != res.request_id
    assert again.request_sha256 == res.request_sha256
    assert (again.stdout, again.exit_code) == (res.stdout, res.exit_code)
    # A result also says how its sandbox started (warm or cold, a member's age) and its wall
    # (its uid), all inside the digest: the digests agree exactly when the results do.
    assert (again.result_sha256 == res.result_sha256) == (again.result == res.result)
    assert again.record.record_sha256 != res.record.record_sha256  # other id, other times


def test_signals_and_non_utf8_output_come_back_exactly(client: plimsoll.Client) -> None:
    res = client.run_python(
        "import os, signal, sys\n"
        "sys.stdout.buffer.write(b'\\xff\\xfe\\x00ok\\n'); sys.stdout.flush()\n"
        "os.kill(os.getpid(), signal.SIGKILL)",
        minimum_isolation="process",
    )
    assert res.stdout == b"\xff\xfe\x00ok\n"
    assert res.stdout.text() == "\ufffd\ufffd\x00ok\n"
    assert res.exit_code is None and res.result.signal == 9
    # On the wire the bytes travelled as base64, and the digest covered them.
    assert b'"stdout":{"base64":"//4Ab2sK"}' in res.body.replace(b" ", b"")


def test_a_snippet_runs_at_the_container_tier(client: plimsoll.Client, container: None) -> None:
    res = client.run_python("import os; print(os.getuid() != 0)", minimum_isolation="container")
    assert res.stdout == b"True\n", res.stderr
    assert res.isolation is Tier.CONTAINER and res.provider == "crun"
    assert res.record.environment.startswith("sha256:"), res.record.environment
    assert res.record.minimum_isolation is Tier.CONTAINER


def test_no_floor_takes_the_daemons_default_floor(client: plimsoll.Client, container: None) -> None:
    res = client.run_javascript("console.log('default')")
    assert client.default_floor() is Tier.CONTAINER
    assert res.isolation >= Tier.CONTAINER and res.stdout == b"default\n"
    # The record states the floor the daemon applied: its default, the one the client learnt.
    assert res.record.minimum_isolation is Tier.CONTAINER


def test_a_floor_no_provider_meets_is_refused_and_nothing_runs(
    client: plimsoll.Client, daemon: Daemon
) -> None:
    before = runs_total(daemon)
    refusals = metrics(daemon)['plimsoll_refusals_total{reason="isolation"}']
    routed = router_refusals(daemon)
    with pytest.raises(plimsoll.NotDispatched) as e:
        client.run_python("print('must not run')", minimum_isolation=Tier.VM)
    assert e.value.reason is Reason.ISOLATION and not_dispatched_reason(e.value) is Reason.ISOLATION
    assert e.value.status == 422 and str(e.value).startswith("not dispatched (isolation): ")
    assert not isinstance(e.value, plimsoll.MayHaveRun)
    # The daemon's own counters agree: a refusal more, not a run more. Through a router, the
    # router refused it before any daemon saw it (docs/cluster.md), and counts it.
    assert runs_total(daemon) == before
    if daemon.router is None:
        assert metrics(daemon)['plimsoll_refusals_total{reason="isolation"}'] == refusals + 1
    else:
        assert metrics(daemon)['plimsoll_refusals_total{reason="isolation"}'] == refusals
        assert router_refusals(daemon) == routed + 1


def test_a_project_round_trips_exact_bytes(client: plimsoll.Client, container: None) -> None:
    blob = bytes(range(256)) * 4
    res = client.run_project(
        [
            Step("./make.sh", name="make"),
            Step("printf '\\377\\376 tail'; printf 'err\\200' >&2", name="bytes"),
        ],
        files=[
            File("make.sh", "#!/bin/sh\nset -e\nmkdir -p out\ncp in/blob.bin out/copy.bin\necho made\n", executable=True),
            File("in/blob.bin", blob),
            File("in/caf\u00e9.txt", "caf\u00e9\n"),
        ],
        artifacts=["out/copy.bin", "in/caf\u00e9.txt", "never/made"],
        minimum_isolation="container",
    )
    r = res.result
    assert r.exit_code == 0, (r.stderr, [s.stderr for s in r.steps])
    assert [s.name for s in r.steps] == ["make", "bytes"]
    assert r.steps[0].stdout == b"made\n"
    assert r.steps[1].stdout == b"\xff\xfe tail" and r.steps[1].stderr == b"err\x80"
    copy = r.artifact("out/copy.bin")
    assert copy.found and copy.size == len(blob) and copy.content == blob and not copy.truncated
    assert r.artifact("in/caf\u00e9.txt").content.text() == "caf\u00e9\n"
    missing = r.artifact("never/made")
    assert not missing.found and missing.size == 0 and missing.content == b""
    assert [a.path for a in r.artifacts] == ["out/copy.bin", "in/caf\u00e9.txt", "never/made"]


def test_the_first_failing_step_stops_the_project(client: plimsoll.Client, container: None) -> None:
    res = client.run_project(["echo one", "exit 3", "echo never"], minimum_isolation="container")
    assert res.exit_code == 3
    assert [s.exit_code for s in res.result.steps] == [0, 3]


def test_a_breached_limit_is_a_result(client: plimsoll.Client) -> None:
    res = client.run_python(
        "import time\nprint('start', flush=True)\ntime.sleep(30)",
        minimum_isolation="process",
        limits=Limits(timeout_ms=1500),
    )
    assert res.result.timed_out and res.stdout == b"start\n"
    res = client.run_python(
        "print('x' * 100)", minimum_isolation="process", limits=Limits(output_bytes=16)
    )
    assert res.result.stdout_truncated and res.stdout == b"x" * 16


def test_a_limit_above_the_maximum_is_refused(client: plimsoll.Client) -> None:
    with pytest.raises(plimsoll.NotDispatched) as e:
        client.run_python("print(1)", minimum_isolation="process", limits=Limits(timeout_ms=10**9))
    assert e.value.reason is Reason.REQUEST


def test_a_provider_the_daemon_lacks_or_cannot_use_is_refused(client: plimsoll.Client) -> None:
    with pytest.raises(plimsoll.NotDispatched) as e:
        client.run_python("print(1)", minimum_isolation="process", provider="no-such-provider")
    assert e.value.reason is Reason.REQUEST
    # The process tier runs no projects.
    with pytest.raises(plimsoll.NotDispatched) as e:
        client.run_project(["true"], minimum_isolation="process", provider="process")
    assert e.value.reason is Reason.UNSUPPORTED


def test_a_named_provider_runs_there(client: plimsoll.Client, container: None) -> None:
    res = client.run_javascript("console.log(1)", minimum_isolation="process", provider="crun")
    assert res.provider == "crun" and res.isolation is Tier.CONTAINER


def test_a_bad_token_is_refused_and_never_printed(daemon: Daemon) -> None:
    secret = "plm_not-a-valid-token-but-still-secret"
    with plimsoll.Client(daemon.url, secret) as c:
        with pytest.raises(plimsoll.NotDispatched) as e:
            c.run_python("print(1)", minimum_isolation="process")
        assert e.value.reason is Reason.PERMISSION and e.value.status == 401
        # Without a floor the default floor is read first; that refusal is permission too.
        with pytest.raises(plimsoll.NotDispatched) as e2:
            c.run_python("print(1)")
        assert e2.value.reason is Reason.PERMISSION
        with pytest.raises(plimsoll.ProvidersError) as e3:
            c.providers()
        for text in (str(e.value), repr(e.value), str(e2.value), str(e3.value), repr(c)):
            assert secret not in text and daemon.token not in text


def test_a_grant_reaches_the_api_through_the_broker(
    client: plimsoll.Client, daemon: Daemon, api: object
) -> None:
    code = "import plimsoll_host as host\nprint(host.get('/orders/42')['item'])"
    res = client.run_python(code, minimum_isolation="process", grant="orders")
    assert res.stdout == b"tea\n", res.stderr
    [call] = res.result.calls
    assert (call.method, call.route, call.status, call.error) == ("GET", "/orders/*", 200, None)
    assert call.response_bytes > 0
    assert api.seen[-1] == {"path": "/orders/42", "authorization": f"Bearer {api.secret}"}  # type: ignore[attr-defined]
    assert api.secret.encode() not in res.body  # type: ignore[attr-defined]
    # A profile the caller may not use, and one that does not exist: the same refusal.
    with pytest.raises(plimsoll.NotDispatched) as e:
        client.run_python(code, minimum_isolation="process", grant="no-such-profile")
    assert e.value.reason is Reason.PERMISSION and e.value.status == 403


def test_providers_are_listed_with_their_evidence(
    client: plimsoll.Client, providers: plimsoll.ProvidersResponse
) -> None:
    assert providers.protocol == 1 and providers.default_floor is Tier.CONTAINER
    assert [p.name for p in providers.providers] == ["process", "crun"]
    process = providers.get("process")
    assert process is not None and process.available and process.isolation is Tier.PROCESS
    # Each evidence digest was recomputed on reading; the run's record names the same one.
    assert plimsoll.evidence_sha256(process.evidence) == process.evidence_sha256
    res = client.run_python("print(1)", minimum_isolation="process", provider="process")
    assert res.record.evidence_sha256 == process.evidence_sha256
    assert client.is_ready()


@pytest.fixture(scope="module")
def small_daemon() -> Iterator[Daemon]:
    """A second daemon, process tier only, with a small body limit and one run per caller."""
    d = start_daemon(
        "small_daemon",
        ["process"],
        max_per_caller=1,
        daemon_settings="max_body_bytes = 4096",
    )
    yield d
    d.stop()


def test_the_daemons_413_echoes_our_id_so_it_reads_not_dispatched(small_daemon: Daemon) -> None:
    # A client that does not know the daemon's smaller body limit: the daemon's refusal must
    # still be recognised as this request's.
    with plimsoll.Client(small_daemon.url, small_daemon.token) as c:
        with pytest.raises(plimsoll.NotDispatched) as e:
            c.run_javascript("console.log('" + "x" * 5000 + "')", minimum_isolation="process")
    assert e.value.reason is Reason.REQUEST and e.value.status == 413


def test_over_the_per_caller_limit_is_a_capacity_refusal(small_daemon: Daemon) -> None:
    with plimsoll.Client(small_daemon.url, small_daemon.token) as c:
        started = threading.Event()
        done: dict[str, plimsoll.RunResponse] = {}

        def long_run() -> None:
            started.set()
            done["r"] = c.run_python(
                "import time; time.sleep(2); print('slow')", minimum_isolation="process"
            )

        t = threading.Thread(target=long_run)
        t.start()
        started.wait()
        # Wait until the daemon counts the first run in flight.
        for _ in range(250):
            if metrics(small_daemon).get("plimsoll_runs_in_flight", 0) >= 1:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the first run never showed in plimsoll_runs_in_flight")
        with pytest.raises(plimsoll.NotDispatched) as e:
            c.run_python("print('second')", minimum_isolation="process")
        t.join(30)
    assert e.value.reason is Reason.CAPACITY and e.value.status == 429
    assert done["r"].stdout == b"slow\n"
