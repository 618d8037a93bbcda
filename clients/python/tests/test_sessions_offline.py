"""What the client decides about sessions without a daemon: the session members read and
digested as the golden vectors say, requests refused unsent, the requests a file's PUT and
GET stand for, stream lines, refusals with their end reason, and the chain."""

from __future__ import annotations

import copy
import json
import socket
from typing import Any, Optional

import pytest

import plimsoll
from plimsoll import EndReason, Reason, Tier, _session, _verify
from plimsoll._session import Chain

from test_digest import BY_NAME
from test_offline import _WALL

SID = "ses_0123456789abcdef_" + "ab" * 16
EVIDENCE = "e" * 64


def test_the_session_members_of_results_and_records_are_read_and_covered() -> None:
    kept = plimsoll.RunResult.from_wire(BY_NAME["result/session-cell-state-kept"]["input"])
    assert (kept.state_kept, kept.interpreter_end) == (True, None)
    ended = plimsoll.RunResult.from_wire(BY_NAME["result/session-cell-interpreter-ended"]["input"])
    assert (ended.state_kept, ended.interpreter_end) == (False, EndReason.INTERPRETER_CRASH)
    assert ended.interpreter_end.ends_interpreter_only
    assert not EndReason.IDLE_TIMEOUT.ends_interpreter_only
    first = BY_NAME["record/session-first-call"]["input"]
    second = BY_NAME["record/session-second-call"]["input"]
    link = plimsoll.RunRecord.from_wire(second).session
    assert link is not None and link.sequence == 2
    assert link.previous_record_sha256 is not None and len(link.previous_record_sha256) == 64
    assert plimsoll.RunRecord.from_wire(first).session.previous_record_sha256 is None  # type: ignore[union-attr]
    # Outside sessions nothing changes: a null session and null cell members are absent.
    plain = copy.deepcopy(BY_NAME["record/plain"]["input"])
    before = plimsoll.record_sha256(plain)
    plain["session"] = None
    assert plimsoll.record_sha256(plain) == before
    r = copy.deepcopy(BY_NAME["result/plain"]["input"])
    was = plimsoll.result_sha256(r)
    r.update(state_kept=None, interpreter_end=None)
    assert plimsoll.result_sha256(r) == was
    # Every member of the link is covered.
    for change in ({"sequence": 3}, {"session_id": SID}, {"previous_record_sha256": "f" * 64}):
        v = copy.deepcopy(second)
        v["session"].update(change)
        assert plimsoll.record_sha256(v) != BY_NAME["record/session-second-call"]["sha256"]
    for bad, says in (
        (dict(second, session={"session_id": SID}), "lacks `sequence`"),
        (dict(second, session=dict(second["session"], extra=1)), "unknown members"),
        (dict(second, session=dict(second["session"], previous_record_sha256="x")), "64 lowercase"),
    ):
        with pytest.raises(ValueError, match=says):
            plimsoll.RunRecord.from_wire(bad)
    with pytest.raises(ValueError, match="not an end reason"):
        plimsoll.RunResult.from_wire(dict(r, interpreter_end="bored"))
    with pytest.raises(plimsoll._digest.EncodingError, match="unknown end reason"):
        plimsoll.result_sha256(dict(r, interpreter_end="bored"))


def _info(**over: Any) -> dict[str, Any]:
    info = {
        "protocol": 1,
        "request_id": "r-open",
        "session_id": SID,
        "language": "python",
        "provider": "crun",
        "isolation": "container",
        "minimum_isolation": "container",
        "evidence_sha256": EVIDENCE,
        "environment": "sha256:" + "1" * 64,
        "wall": _WALL,
        "opened_unix_ms": 1,
        "expires_unix_ms": 2,
        "idle_timeout_ms": 3,
        "calls": 0,
        "interpreter_alive": True,
    }
    info.update(over)
    return {k: v for k, v in info.items() if v is not None}


def _open(floor: Optional[str] = "container", provider: Optional[str] = None) -> _session.PreparedOpen:
    p = _session.prepare_open("python", minimum_isolation=floor, provider=provider)
    return _session.PreparedOpen("r-open", p.body, p.language, p.floor, p.provider)


def test_an_open_answer_is_checked() -> None:
    p = _open()
    info = _session.read_opened(p, 200, json.dumps(_info()).encode())
    assert info.session_id == SID and info.wall.uid == _WALL["uid"]
    assert _session.check_opened(p, info, None) is None
    # Not ours: another id, or none.
    with pytest.raises(plimsoll.RequestIdMismatch):
        _session.read_opened(p, 200, json.dumps(_info(request_id="r-other")).encode())
    with pytest.raises(plimsoll.RequestIdMismatch):
        _session.read_opened(p, 200, json.dumps(_info(request_id=None)).encode())
    for bad in (_info(extra=1), _info(session_id="ses_x"), _info(wall=None), _info(language="go")):
        with pytest.raises(plimsoll.BadResponse):
            _session.read_opened(p, 200, json.dumps(bad).encode())

    def problem(p: _session.PreparedOpen, default: Optional[Tier] = None, **over: Any) -> Any:
        info = _session.read_opened(p, 200, json.dumps(_info(**over)).encode())
        return _session.check_opened(p, info, default)

    e = problem(_open("kernel"), minimum_isolation="kernel")
    assert isinstance(e, plimsoll.EvidenceMismatch) and e.floor is Tier.KERNEL
    assert "the session used `container`" in str(e)
    e = problem(_open(None), Tier.KERNEL)
    assert isinstance(e, plimsoll.EvidenceMismatch) and "default floor" in str(e)
    e = problem(_open("process"), isolation="process", minimum_isolation="container")
    assert isinstance(e, plimsoll.EvidenceMismatch) and "says it holds" in str(e)
    e = problem(_open("container"), minimum_isolation="process")
    assert isinstance(e, plimsoll.RecordMismatch) and e.field == "minimum_isolation"
    e = problem(_open(None), Tier.CONTAINER, minimum_isolation="process")
    assert isinstance(e, plimsoll.RecordMismatch) and "default floor" in str(e)
    e = problem(_open("container", provider="runsc"))
    assert isinstance(e, plimsoll.ProviderMismatch) and e.provider == "crun"
    for over in ({"calls": 3, "last_record_sha256": "f" * 64}, {"end_reason": "closed"}):
        assert isinstance(problem(_open(), **over), plimsoll.BadResponse)
    assert problem(_open(None)) is None  # no floor, none learnt: nothing to hold it to


def test_open_requests_are_checked_before_anything_is_sent() -> None:
    p = _session.prepare_open(
        "javascript",
        minimum_isolation=Tier.CONTAINER,
        grant="pkgs",
        limits=plimsoll.Limits(memory_bytes=1 << 28, timeout_ms=5000),
        idle_timeout_ms=60_000,
        max_lifetime_ms=600_000,
    )
    sent = json.loads(p.body)
    assert list(sent)[:3] == ["protocol", "request_id", "language"]
    # The grant the session holds for its whole life travels with the open, and only there.
    assert sent["grant"] == "pkgs"
    assert "grant" not in json.loads(_session.prepare_open("python").body)
    assert sent["limits"] == {"timeout_ms": 5000, "memory_bytes": 1 << 28}
    assert (sent["idle_timeout_ms"], sent["max_lifetime_ms"]) == (60_000, 600_000)
    for bad in (
        dict(language="ruby"),
        dict(language="python", minimum_isolation="hypervisor"),
        dict(language="python", provider=""),
        dict(language="python", grant=""),
        dict(language="python", grant=7),
        dict(language="python", idle_timeout_ms=0),
        dict(language="python", max_lifetime_ms=True),
        dict(language="python", limits=plimsoll.Limits(pids=0)),
    ):
        with pytest.raises(plimsoll.InvalidRequest):
            _session.prepare_open(**bad)
    with pytest.raises(plimsoll.RequestTooLarge):
        _session.prepare_open("python", max_body_bytes=10)


def test_session_calls_are_checked_before_anything_is_sent() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    info = plimsoll.SessionInfo.from_wire(_info())
    with plimsoll.Client(url, "t", max_body_bytes=400) as c:
        s = plimsoll.Session(c, info, Chain(info, 0, None))
        for call in (
            lambda: s.cell("   "),
            lambda: s.cell("print(1)", timeout_ms=0),
            lambda: s.steps([]),
            lambda: s.steps("echo one string"),  # type: ignore[arg-type]
            lambda: s.steps(["true"], files=[plimsoll.File("../x", b"")]),
            lambda: s.put("/etc/passwd", b"x"),
            lambda: s.put("a/../b", b"x"),
            lambda: s.put("x", "text, not bytes"),  # type: ignore[arg-type]
            lambda: s.get(""),
            lambda: s.put("x", b"x" * 401),
            lambda: s.cell("print('" + "x" * 400 + "')"),
        ):
            with pytest.raises(plimsoll.InvalidRequest) as e:
                call()
            assert not_sent(e.value)
        # A chain in doubt sends nothing either.
        s._chain.doubt("r-earlier")
        with pytest.raises(plimsoll.ChainInDoubt) as doubt:
            s.cell("print(1)")
        assert doubt.value.earlier == "r-earlier" and "resync()" in str(doubt.value)
        assert not_sent(doubt.value)
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    with pytest.raises(plimsoll.InvalidRequest):
        plimsoll.Client(url, "t").session("ses_../../x")


def not_sent(e: plimsoll.PlimsollError) -> bool:
    return plimsoll.not_dispatched_reason(e) is Reason.REQUEST


def test_a_files_put_and_get_stand_for_the_daemons_requests() -> None:
    # docs/sessions.md: PUT stands for {"protocol":1,"request_id":ID,"run":{"kind":"project",
    # "files":[{"path":PATH,"content":BYTES}],"steps":[]}}, GET for the project of one artifact.
    put = _session.prepare_put("data/b.bin", b"\xff\x00", 1 << 20)
    assert put.content == b"\xff\x00"
    assert put.prepared.sent["run"]["files"] == [
        {"path": "data/b.bin", "content": {"base64": "/wA="}}
    ]
    stands_for = {
        "protocol": 1,
        "run": {
            "kind": "project",
            "files": [{"path": "data/b.bin", "content": {"base64": "/wA="}, "executable": False}],
        },
    }
    assert plimsoll.request_sha256(put.prepared.sent) == plimsoll.request_sha256(stands_for)
    got = _session.prepare_get("a b/ü.txt")
    assert got.prepared.sent["run"] == {"kind": "project", "artifacts": ["a b/ü.txt"], "steps": []}
    assert _session.file_headers(got.prepared.request_id)["plimsoll-request-id"] == got.prepared.request_id
    assert _session.file_url("http://d", SID, "a b/ü.txt") == (
        f"http://d/v1/sessions/{SID}/files/a%20b/%C3%BC.txt"
    )


def test_refusals_carry_their_code_and_end_reason_and_need_our_id() -> None:
    def answer(rid: Optional[str], code: str, mark: Optional[str], end: Optional[str]) -> bytes:
        err: dict[str, Any] = {"code": code, "message": "m", "not_dispatched": mark}
        if end is not None:
            err["end_reason"] = end
        return json.dumps({"protocol": 1, "request_id": rid, "error": err}).encode()

    e = _verify.error_for("r-1", 410, answer("r-1", "session_ended", "request", "idle_timeout"))
    assert isinstance(e, plimsoll.NotDispatched)
    assert (e.code, e.end_reason, e.status) == ("session_ended", EndReason.IDLE_TIMEOUT, 410)
    assert "idle_timeout" in str(e)
    e = _verify.error_for("r-1", 404, answer("r-1", "session_not_found", "request", "daemon_restarted"))
    assert isinstance(e, plimsoll.NotDispatched) and e.end_reason is EndReason.DAEMON_RESTARTED
    e = _verify.error_for("r-1", 410, answer(None, "session_ended", "request", "closed"))
    assert isinstance(e, plimsoll.UnverifiedRefusal) and plimsoll.not_dispatched_reason(e) is None
    e = _verify.error_for("r-1", 500, answer("r-1", "sandbox_failed", None, None))
    assert isinstance(e, plimsoll.DaemonFailed) and e.code == "sandbox_failed"
    e = _verify.error_for("r-1", 410, answer("r-1", "session_ended", "request", "bored"))
    assert isinstance(e, plimsoll.BadResponse)
    # A show or a list runs nothing: its failure is a SessionsError, with the daemon's code.
    with pytest.raises(plimsoll.SessionsError) as s:
        _session.read_shown("u", SID, 410, answer(None, "session_ended", "request", "closed"))
    assert (s.value.code, s.value.end_reason, s.value.status) == ("session_ended", EndReason.CLOSED, 410)
    with pytest.raises(plimsoll.SessionsError, match="shows session"):
        _session.read_shown("u", SID, 200, json.dumps(_info(session_id=SID[:-1] + "0")).encode())
    with pytest.raises(plimsoll.SessionsError, match="not consistent"):
        _session.read_shown("u", SID, 200, json.dumps(_info(calls=2)).encode())
    listed = _session.read_list("u", 200, json.dumps({"protocol": 1, "sessions": [_info()]}).encode())
    assert len(listed) == 1 and listed.get(SID) is not None and listed.get("x") is None
    with pytest.raises(plimsoll.SessionsError):
        _session.read_list("u", 200, b'{"protocol":1,"sessions":[{}]}')


def test_a_close_must_say_closed_for_this_request() -> None:
    ok = json.dumps(_info(request_id="r-c", end_reason="closed")).encode()
    assert _session.read_closed("r-c", SID, 200, ok).end_reason is EndReason.CLOSED
    with pytest.raises(plimsoll.RequestIdMismatch):
        _session.read_closed("r-other", SID, 200, ok)
    with pytest.raises(plimsoll.BadResponse, match="not closed"):
        _session.read_closed("r-c", SID, 200, json.dumps(_info(request_id="r-c")).encode())


# --- calls and the chain ----------------------------------------------------------------


def _call(
    p: _verify.Prepared, sequence: int, previous: Optional[str], **record_over: Any
) -> dict[str, Any]:
    """An honest answer to a session call ``p`` at ``sequence`` after ``previous``."""
    result = {
        "exit_code": 0,
        "timed_out": False,
        "stdout": "1\n",
        "stdout_truncated": False,
        "stderr": "",
        "stderr_truncated": False,
        "wall": _WALL,
        "state_kept": True,
    }
    link: dict[str, Any] = {"session_id": SID, "sequence": sequence}
    if previous is not None:
        link["previous_record_sha256"] = previous
    record = {
        "request_id": p.request_id,
        "request_sha256": plimsoll.request_sha256(p.sent),
        "result_sha256": plimsoll.result_sha256(result),
        "provider": "crun",
        "isolation": "container",
        "minimum_isolation": "container",
        "evidence_sha256": EVIDENCE,
        "environment": "sha256:" + "1" * 64,
        "started_unix_ms": 1,
        "ended_unix_ms": 2,
        "session": link,
        **record_over,
    }
    record["record_sha256"] = plimsoll.record_sha256(record)
    return {
        "protocol": 1,
        "request_id": p.request_id,
        "provider": record["provider"],
        "isolation": record["isolation"],
        "duration_ms": 1,
        "request_sha256": record["request_sha256"],
        "result_sha256": record["result_sha256"],
        "result": result,
        "record": record,
    }


def _cell() -> _verify.Prepared:
    return _session.prepare_call(
        plimsoll.Snippet("python", "print(1)"), timeout_ms=None, max_body_bytes=1 << 20
    )


def _verified(p: _verify.Prepared, answer: dict[str, Any]) -> plimsoll.RunResponse:
    return _verify.verify_answer(
        p, 200, json.dumps(answer).encode(), Tier.CONTAINER,
        default_floor_name=_session.SESSION_FLOOR,
    )


def test_each_call_must_follow_the_chain() -> None:
    info = plimsoll.SessionInfo.from_wire(_info())
    chain = Chain(info, 0, None)
    p1 = _cell()
    r1 = chain.follow(p1, _verified(p1, _call(p1, 1, None)))
    assert (chain.sequence, chain.previous) == (1, r1.record.record_sha256)
    assert chain.info.calls == 1 and chain.info.last_record_sha256 == r1.record.record_sha256
    p2 = _cell()
    good = _call(p2, 2, r1.record.record_sha256)
    for bad, field in (
        (_call(p2, 1, None), "sequence"),  # an earlier call's place: replayed
        (_call(p2, 3, r1.record.record_sha256), "sequence"),  # a call missing
        (_call(p2, 2, "0" * 64), "previous_record_sha256"),
        (_call(p2, 2, r1.record.record_sha256, session={"session_id": SID[:-1] + "0", "sequence": 2}), "session_id"),
        (_call(p2, 2, r1.record.record_sha256, evidence_sha256="d" * 64), "evidence_sha256"),
        (_call(p2, 2, r1.record.record_sha256, environment="elsewhere"), "environment"),
    ):
        with pytest.raises(plimsoll.ChainMismatch) as e:
            chain.follow(p2, _verified(p2, bad))
        assert e.value.field == field and plimsoll.not_dispatched_reason(e.value) is None
        assert (chain.sequence, chain.previous) == (1, r1.record.record_sha256)
    no_link = _call(p2, 2, None)
    del no_link["record"]["session"]
    no_link["record"]["record_sha256"] = plimsoll.record_sha256(no_link["record"])
    with pytest.raises(plimsoll.ChainMismatch, match="names no session"):
        chain.follow(p2, _verified(p2, no_link))
    chain.follow(p2, _verified(p2, good))
    assert chain.sequence == 2
    # The session's floor is what a call's tier and record are held to.
    p3 = _cell()
    low = _call(p3, 3, chain.previous, minimum_isolation="process")
    with pytest.raises(plimsoll.RecordMismatch, match="the session's floor"):
        _verified(p3, low)
    # Resync takes the daemon's word, but not another provider's.
    chain.doubt("r-x")
    chain.resync(plimsoll.SessionInfo.from_wire(_info(calls=7, last_record_sha256="c" * 64)))
    assert (chain.sequence, chain.previous, chain.in_doubt) == (7, "c" * 64, None)
    with pytest.raises(plimsoll.SessionsError, match="provider"):
        chain.resync(plimsoll.SessionInfo.from_wire(_info(provider="runc")))


def test_stream_lines_are_read_strictly_and_the_last_verified_as_a_whole_answer() -> None:
    p = _cell()
    chunk = _session.read_line(
        p,
        b'{"chunk":{"preview":true,"stream":"stderr","offset":3,"bytes":{"base64":"/w=="}}}',
        Tier.CONTAINER,
    )
    assert isinstance(chunk, plimsoll.OutputChunk)
    assert (chunk.stream, chunk.offset, chunk.bytes) == (plimsoll.OutputStream.STDERR, 3, b"\xff")
    for bad in (
        b'{"chunk":{"preview":false,"stream":"stdout","offset":0,"bytes":""}}',
        b'{"chunk":{"preview":true,"stream":"stdin","offset":0,"bytes":""}}',
        b'{"chunk":{"preview":true,"stream":"stdout","offset":0,"bytes":"","x":1}}',
        b'{"chunk":{},"response":{}}',
        b'{"progress":1}',
        b"[1]",
    ):
        with pytest.raises(plimsoll.BadResponse):
            _session.read_line(p, bad, Tier.CONTAINER)
    answer = _call(p, 1, None)
    line = b'{"response": ' + json.dumps(answer).encode() + b" }"
    r = _session.read_line(p, line, Tier.CONTAINER)
    assert isinstance(r, plimsoll.RunResponse) and r.stdout == b"1\n"
    assert r.body == json.dumps(answer).encode()  # the response's bytes as they came
    altered = copy.deepcopy(answer)
    altered["result"]["stdout"] = "2\n"
    with pytest.raises(plimsoll.DigestMismatch):
        _session.read_line(p, json.dumps({"response": altered}).encode(), Tier.CONTAINER)
    err = {"protocol": 1, "request_id": p.request_id, "error": {
        "code": "session_ended", "message": "m", "not_dispatched": "request", "end_reason": "max_lifetime"}}
    with pytest.raises(plimsoll.NotDispatched) as e:
        _session.read_line(p, json.dumps({"error": err}).encode(), Tier.CONTAINER)
    assert e.value.end_reason is EndReason.MAX_LIFETIME and e.value.code == "session_ended"
    err["request_id"] = "r-other"
    with pytest.raises(plimsoll.UnverifiedRefusal):
        _session.read_line(p, json.dumps({"error": err}).encode(), Tier.CONTAINER)


def test_lines_are_cut_where_they_end_whatever_the_chunks() -> None:
    lines = _session.Lines()
    assert lines.feed(b'{"a"') == []
    # Empty lines are keep-alives, skipped.
    assert lines.feed(b':1}\n\n{"b":2}\n\r\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert lines.feed(b":3}") == [] and lines.rest() == b'{"c":3}'
    assert _session.is_streamed(200, "application/x-ndjson; charset=utf-8")
    assert not _session.is_streamed(200, "application/json")
    assert not _session.is_streamed(410, "application/x-ndjson")
