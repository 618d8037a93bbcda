"""What the client decides without a daemon: requests refused before anything is sent, an
unreachable daemon, answers checked, the types, and the package building offline."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import plimsoll
from plimsoll import (
    File,
    Limits,
    Project,
    Reason,
    Snippet,
    Step,
    Tier,
    not_dispatched_reason,
)
from plimsoll import _digest, _verify

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = HERE.parent


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_tiers_are_ordered_weakest_first() -> None:
    assert Tier.PROCESS < Tier.CONTAINER < Tier.KERNEL < Tier.VM
    assert sorted([Tier.VM, Tier.PROCESS, Tier.KERNEL]) == [Tier.PROCESS, Tier.KERNEL, Tier.VM]
    assert min(Tier.VM, Tier.CONTAINER) is Tier.CONTAINER
    assert Tier("kernel") is Tier.KERNEL and Tier.KERNEL == "kernel"
    assert str(Tier.VM) == "vm"
    # Against a tier's name too, by rank and never alphabetically.
    assert Tier.PROCESS < "container" and "container" > Tier.PROCESS and Tier.VM >= "kernel"
    with pytest.raises(ValueError):
        assert Tier.VM > "hypervisor"


def test_output_is_exact_bytes_with_a_text_helper() -> None:
    out = plimsoll.Output(b"caf\xc3\xa9 \xff\n")
    assert out == b"caf\xc3\xa9 \xff\n"
    assert out.text() == "café \ufffd\n"
    with pytest.raises(UnicodeDecodeError):
        out.text("strict")


def test_not_dispatched_reason_of_foreign_errors_is_none() -> None:
    assert not_dispatched_reason(ValueError("x")) is None
    assert not_dispatched_reason(plimsoll.MayHaveRun("x")) is None
    e = plimsoll.NotDispatched(Reason.CAPACITY, "busy")
    assert not_dispatched_reason(e) is Reason.CAPACITY and e.reason is Reason.CAPACITY
    assert str(e) == "not dispatched (capacity): busy"


@pytest.mark.parametrize(
    "spec, options",
    [
        (Snippet("python", "   "), {}),
        (Snippet("ruby", "puts 1"), {}),
        (Snippet("python", "print(1)"), {"minimum_isolation": "hypervisor"}),
        (Snippet("python", "print(1)"), {"provider": ""}),
        (Snippet("python", "print(1)"), {"grant": ""}),
        (Snippet("python", "print(1)"), {"limits": Limits(timeout_ms=0)}),
        (Project(steps=[]), {}),
        (Project(steps=["  "]), {}),
        (Project(steps=["true"], files=[File("../x", b"")]), {}),
        (Project(steps=["true"], files=[File("/etc/x", b"")]), {}),
        (Project(steps=["true"], files=[File("a", b""), File("a", b"")]), {}),
        (Project(steps=["true"], artifacts=["a//b"]), {}),
        (Project(steps="echo one string"), {}),  # type: ignore[arg-type]
        (Project(steps=["true"], artifacts="out"), {}),  # type: ignore[arg-type]
        (Snippet("python", "print('\ud800')"), {}),
    ],
)
def test_an_invalid_request_is_refused_unsent(spec: plimsoll.RunSpec, options: dict) -> None:
    # A real listener that nothing may connect to.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with plimsoll.Client(url, "t", default_floor="process") as c:
        with pytest.raises(plimsoll.InvalidRequest) as e:
            c.run(spec, **options)
    assert not_dispatched_reason(e.value) is Reason.REQUEST
    assert e.value.request_id and len(e.value.request_id) == 32
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


def test_a_request_over_the_body_limit_is_refused_here_and_not_sent() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    big = "console.log('" + "x" * (9 * 1024 * 1024) + "')"
    small = "console.log('" + "x" * 5000 + "')"
    with plimsoll.Client(url, "t") as c, plimsoll.Client(url, "t", max_body_bytes=4096) as tight:
        assert c.max_body_bytes == plimsoll.DEFAULT_MAX_BODY_BYTES == 8 * 1024 * 1024
        for client, code in ((c, big), (tight, small)):
            with pytest.raises(plimsoll.RequestTooLarge) as e:
                client.run_javascript(code, minimum_isolation="process")
            assert isinstance(e.value, plimsoll.NotDispatched)
            assert not_dispatched_reason(e.value) is Reason.REQUEST
            assert "limit" in str(e.value) and e.value.size > e.value.limit
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


def test_a_refused_connection_is_not_dispatched() -> None:
    with plimsoll.Client(f"http://127.0.0.1:{_free_port()}", "t") as c:
        with pytest.raises(plimsoll.Unreachable) as e:
            c.run_python("print(1)", minimum_isolation="process")
        assert not_dispatched_reason(e.value) is Reason.ENVIRONMENT
        assert "check that plimsolld is running" in str(e.value)
        assert not c.is_ready()
        # With no floor the default floor is needed first: unreachable as well, nothing sent.
        with pytest.raises(plimsoll.NotDispatched) as e2:
            c.run_python("print(1)")
        assert not_dispatched_reason(e2.value) is Reason.ENVIRONMENT


def test_the_token_is_never_printed() -> None:
    secret = "plm_s3cr3t-token-that-must-not-leak"
    c = plimsoll.Client(f"http://127.0.0.1:{_free_port()}", secret)
    try:
        with pytest.raises(plimsoll.PlimsollError) as e:
            c.run_python("print(1)", minimum_isolation="process")
        for text in (repr(c), str(c), str(e.value), repr(e.value)):
            assert secret not in text, text
    finally:
        c.close()
    with pytest.raises(ValueError) as bad:
        plimsoll.Client("http://x", "plm_with space")
    assert "plm_with" not in str(bad.value)


def _prepared(floor: "str | None" = None, provider: "str | None" = None) -> _verify.Prepared:
    return _verify.prepare(
        Snippet("python", "print(1)"), minimum_isolation=floor, provider=provider, request_id="r-1"
    )


def test_request_bodies_put_the_id_before_the_run_and_read_back_as_sent() -> None:
    p = _verify.prepare(
        Project(
            steps=[Step("sh run.sh", name="go")],
            files=[File("run.sh", "echo hi\n", executable=True), File("blob", b"\xff\x00")],
            artifacts=["out"],
        ),
        minimum_isolation=Tier.CONTAINER,
        limits=Limits(timeout_ms=5000),
        request_id="r-9",
    )
    text = p.body.decode()
    assert text.index('"request_id"') < text.index('"run"')
    assert "null" not in text
    assert p.sent["run"]["files"][1]["content"] == {"base64": "/wA="}
    assert p.sent["run"]["files"][0]["executable"] is True
    assert p.budget_s == 5 + _verify.EXCHANGE_SLACK_S


def test_error_answers_are_honoured_only_with_our_id() -> None:
    p = _prepared()

    def answer(rid: object, mark: object) -> bytes:
        import json

        return json.dumps(
            {"protocol": 1, "request_id": rid, "error": {"code": "x", "message": "m", "not_dispatched": mark}}
        ).encode()

    e = _verify.error_for(p, 422, answer("r-1", "isolation"))
    assert isinstance(e, plimsoll.NotDispatched) and e.reason is Reason.ISOLATION
    for rid in (None, "r-2"):
        e = _verify.error_for(p, 422, answer(rid, "isolation"))
        assert isinstance(e, plimsoll.UnverifiedRefusal) and not_dispatched_reason(e) is None
    e = _verify.error_for(p, 500, answer("r-1", None))
    assert isinstance(e, plimsoll.DaemonFailed) and not_dispatched_reason(e) is None
    # Left-out nullable members read as null.
    e = _verify.error_for(p, 500, b'{"protocol":1,"error":{"code":"internal","message":"m"}}')
    assert isinstance(e, plimsoll.DaemonFailed)
    for bad in (
        b"<html>bad gateway</html>",
        b'{"protocol":1,"request_id":"r-1","error":{"code":"x","message":"m","not_dispatched":"maybe"}}',
        b'{"protocol":1,"request_id":"r-1","request_id":"r-1","error":{"code":"x","message":"m","not_dispatched":"request"}}',
        b'{"protocol":1,"request_id":"r-1","error":{"code":"x","message":"m","not_dispatched":"request","hint":1}}',
    ):
        e = _verify.error_for(p, 400, bad)
        assert isinstance(e, plimsoll.BadResponse), bad
        assert not_dispatched_reason(e) is None


def test_the_package_builds_offline_and_installs_from_its_directory(tmp_path: Path) -> None:
    """`python -m build` with the venv's own backend (no isolation, so no index), then the
    wheel installs into a fresh venv with no index and imports."""
    out = tmp_path / "dist"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_NO_INDEX"] = "1"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist", "--outdir", str(out), str(PACKAGE_DIR)],
        check=True,
        capture_output=True,
        env=env,
    )
    wheels = list(out.glob("plimsoll-*.whl"))
    assert len(wheels) == 1 and list(out.glob("plimsoll-*.tar.gz"))
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "plimsoll/__init__.py" in names and "plimsoll/py.typed" in names
    venv = tmp_path / "venv"
    # The fresh venv sees the test venv's packages (httpx) so nothing is fetched.
    subprocess.run(
        ["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True
    )
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    (next(venv.glob("lib/python3*/site-packages")) / "deps.pth").write_text(str(site) + "\n")
    target = tmp_path / "installed"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(target), str(wheels[0])],
        check=True,
        capture_output=True,
        env=env,
    )
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import plimsoll, sys; print(plimsoll.__file__); print(plimsoll.Tier.VM > plimsoll.Tier.KERNEL)"],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    lines = probe.stdout.split()
    assert lines[0].startswith(str(target)) and lines[1] == "True", probe.stdout


def test_a_connection_closed_after_the_request_left_may_have_run() -> None:
    """A real listener that reads the whole request, then closes without answering (as a
    daemon that died mid-run would): the code may have run."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    got = bytearray()

    def serve() -> None:
        conn, _ = listener.accept()
        conn.settimeout(10)
        while b"print(1)" not in got:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got.extend(chunk)
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with plimsoll.Client(url, "t") as c:
        with pytest.raises(plimsoll.TransportError) as e:
            c.run_python("print(1)", minimum_isolation="process")
    t.join(10)
    listener.close()
    assert b"POST /v1/runs" in got
    assert isinstance(e.value, plimsoll.MayHaveRun) and not_dispatched_reason(e.value) is None
    assert "may have run" in str(e.value)


def _answer(p: _verify.Prepared, **result_members: object) -> bytes:
    """An honest 200 answer to ``p``, its result holding ``result_members``, every digest
    computed over it."""
    import json

    result = {
        "exit_code": 0,
        "timed_out": False,
        "stdout": "1\n",
        "stdout_truncated": False,
        "stderr": "",
        "stderr_truncated": False,
        **result_members,
    }
    try:
        result_sha256 = plimsoll.result_sha256(result)
    except _digest.EncodingError:  # a result no digest exists for: the parse refuses it first
        result_sha256 = "0" * 64
    record = {
        "request_id": p.request_id,
        "request_sha256": plimsoll.request_sha256(p.sent),
        "result_sha256": result_sha256,
        "provider": "process",
        "isolation": "process",
        "minimum_isolation": "process",
        "evidence_sha256": "e" * 64,
        "environment": "test",
        "started_unix_ms": 1,
        "ended_unix_ms": 2,
    }
    record["record_sha256"] = plimsoll.record_sha256(record)
    return json.dumps(
        {
            "protocol": 1,
            "request_id": p.request_id,
            "provider": "process",
            "isolation": "process",
            "duration_ms": 1,
            "request_sha256": record["request_sha256"],
            "result_sha256": record["result_sha256"],
            "result": result,
            "record": record,
        }
    ).encode()


_WALL = {
    "uid": 2000100,
    "euid": 2000100,
    "gid": 2000100,
    "cap_eff": "0000000000000000",
    "no_new_privs": True,
    "seccomp": 2,
    "namespaces": [{"name": "net", "id": "net:[4026532302]", "same_as_host": False}],
    "root_read_only": True,
    "network_interfaces": ["lo"],
    "memory_limit_bytes": 268435456,
}


def test_the_wall_is_read_digested_and_a_malformed_one_refused() -> None:
    p = _prepared()
    r = _verify.verify_answer(p, 200, _answer(p, start="cold", wall=_WALL)).result
    assert r.wall is not None
    assert (r.wall.uid, r.wall.seccomp, r.wall.no_new_privs) == (2000100, 2, True)
    assert r.wall.namespaces == [
        plimsoll.WallNamespace(name="net", id="net:[4026532302]", same_as_host=False)
    ]
    assert (r.wall.cap_amb, r.wall.pids_limit, r.wall.groups) == (None, None, [])
    # null members read as absent, and digest as absent.
    nulls = dict(_WALL, cap_amb=None, pids_limit=None, groups=None)
    assert plimsoll.result_sha256({"wall": nulls, **_RESULT}) == plimsoll.result_sha256(
        {"wall": _WALL, **_RESULT}
    )
    # The wall is inside the digest: a changed member changes it.
    assert plimsoll.result_sha256({"wall": dict(_WALL, uid=0), **_RESULT}) != plimsoll.result_sha256(
        {"wall": _WALL, **_RESULT}
    )
    for wall, says in (
        (dict(_WALL, extra=1), "unknown members: extra"),
        ({k: v for k, v in _WALL.items() if k != "root_read_only"}, "lacks `root_read_only`"),
        (dict(_WALL, uid=1 << 32), "result.wall.uid is not an integer in range"),
        (dict(_WALL, groups=[-1]), "result.wall.groups[0]"),
        (dict(_WALL, namespaces=[{"name": "net"}]), "lacks `id`"),
        (dict(_WALL, no_new_privs="yes"), "no_new_privs is not a boolean"),
    ):
        with pytest.raises(plimsoll.BadResponse) as e:
            _verify.verify_answer(p, 200, _answer(p, start="cold", wall=wall))
        assert says in str(e.value), wall


_RESULT = {
    "exit_code": 0,
    "timed_out": False,
    "stdout": "",
    "stdout_truncated": False,
    "stderr": "",
    "stderr_truncated": False,
}


def test_the_start_is_read_and_a_member_age_without_a_warm_start_is_refused() -> None:
    p = _prepared()
    r = _verify.verify_answer(p, 200, _answer(p, start="warm", member_age_ms=1500)).result
    assert (r.start, r.member_age_ms) == (plimsoll.Start.WARM, 1500)
    r = _verify.verify_answer(p, 200, _answer(p, start="cold")).result
    assert (r.start, r.member_age_ms) == (plimsoll.Start.COLD, None)
    r = _verify.verify_answer(p, 200, _answer(p)).result  # written before the members existed
    assert (r.start, r.member_age_ms) == (None, None)
    for members, says in (
        ({"member_age_ms": 1500}, "`start` is absent"),
        ({"start": "cold", "member_age_ms": 1500}, '`start` is "cold"'),
        ({"start": "warm"}, "`member_age_ms` is absent"),
    ):
        with pytest.raises(plimsoll.BadResponse, match="malformed") as e:
            _verify.verify_answer(p, 200, _answer(p, **members))
        assert says in str(e.value), members
        assert not_dispatched_reason(e.value) is None
    with pytest.raises(plimsoll.BadResponse, match="not warm or cold"):
        hot = _answer(p, start="cold").replace(b'"start": "cold"', b'"start": "hot"')
        _verify.verify_answer(p, 200, hot)
