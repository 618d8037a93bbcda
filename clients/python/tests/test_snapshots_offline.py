"""What the client decides about snapshots and forks without a daemon: the origin read and
digested as the golden vectors say (record field 14), the snapshot answers read strictly,
requests refused unsent, and every check of a fork's copies, a restored session and the
origin on each of its records, on their own and through a fake daemon on loopback that
answers a fork whose copy hangs from another parent, or a call whose record's origin is not
its session's (rejected, the copies closed again)."""

from __future__ import annotations

import copy
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, Callable, Optional

import pytest

import plimsoll
from plimsoll import Reason, SessionStart, Tier, _digest, _session, _types, _verify
from plimsoll._session import Chain

from test_digest import BY_NAME
from test_sessions_offline import EVIDENCE, SID, _call, _info, _verified

SNAP_ID = "snp_0123456789abcdef_" + "cd" * 16
SNAP_SHA = "a1" * 32
LAST = "1e" * 32
COPIES = ["ses_0123456789abcdef_" + f"{i:032x}" for i in range(1, 5)]


def _snap(rid: Optional[str], **over: Any) -> dict[str, Any]:
    snap = {
        "protocol": 1,
        "request_id": rid,
        "snapshot_id": SNAP_ID,
        "session_id": SID,
        "sha256": SNAP_SHA,
        "bytes": 2_000_000,
        "provider": "crun",
        "isolation": "container",
        "language": "python",
        "calls": 2,
        "last_record_sha256": LAST,
        "checkpoint_ms": 480,
        "created_unix_ms": 10,
        "expires_unix_ms": 20,
    }
    snap.update(over)
    return {k: v for k, v in snap.items() if v is not None}


def _origin(start: str = "forked", **over: Any) -> dict[str, Any]:
    o = {
        "start": start,
        "snapshot_sha256": SNAP_SHA,
        "parent_session_id": SID,
        "parent_record_sha256": LAST,
        "parent_calls": 2,
    }
    o.update(over)
    return {k: v for k, v in o.items() if v is not None}


def _copy(rid: str, sid: str, start: str = "forked", **over: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        request_id=rid, session_id=sid, calls=2, last_record_sha256=LAST, origin=_origin(start)
    )
    fields.update(over)
    return _info(**fields)


def _fork(rid: str, count: int = 2) -> dict[str, Any]:
    return {
        "protocol": 1,
        "request_id": rid,
        "snapshot": _snap(rid),
        "sessions": [_copy(rid, sid) for sid in COPIES[:count]],
    }


def _parent() -> plimsoll.SessionInfo:
    return plimsoll.SessionInfo.from_wire(_info(calls=2, last_record_sha256=LAST))


def _parent_chain() -> Chain:
    return Chain(_parent(), 2, LAST)


# --- the origin, read and digested ------------------------------------------------------


def test_the_origin_vectors_are_read() -> None:
    forked = plimsoll.RunRecord.from_wire(BY_NAME["record/forked-call"]["input"])
    link = forked.session
    assert link is not None and link.origin is not None
    o = link.origin
    assert (o.start, o.parent_calls, link.sequence) == (SessionStart.FORKED, 2, 3)
    assert o.parent_record_sha256 == link.previous_record_sha256
    assert o.parent_session_id != link.session_id
    restored = plimsoll.RunRecord.from_wire(BY_NAME["record/restored-first-call"]["input"])
    ro = restored.session.origin  # type: ignore[union-attr]
    assert ro is not None and ro.start is SessionStart.RESTORED
    assert (ro.parent_calls, ro.parent_record_sha256) == (0, None)
    # Null is absent, at every depth.
    nulls = plimsoll.RunRecord.from_wire(BY_NAME["record/restored-first-call-nulls"]["input"])
    assert nulls == restored
    assert str(SessionStart.FORKED) == "forked"


@pytest.mark.parametrize(
    "member, value",
    [
        ("start", "restored"),
        ("snapshot_sha256", "b" * 64),
        ("parent_session_id", SID),
        ("parent_record_sha256", "0" * 64),
        ("parent_calls", 3),
    ],
)
def test_every_member_of_the_origin_is_covered(member: str, value: Any) -> None:
    vector = BY_NAME["record/forked-call"]
    record = copy.deepcopy(vector["input"])
    record["session"]["origin"][member] = value
    assert plimsoll.record_sha256(record) != vector["sha256"]


def test_a_record_without_an_origin_is_another_record_and_null_is_absent() -> None:
    vector = BY_NAME["record/forked-call"]
    record = copy.deepcopy(vector["input"])
    record["session"]["origin"]["parent_record_sha256"] = None
    without_parent = plimsoll.record_sha256(record)
    del record["session"]["origin"]["parent_record_sha256"]
    assert plimsoll.record_sha256(record) == without_parent != vector["sha256"]
    record = copy.deepcopy(vector["input"])
    del record["session"]["origin"]
    none = plimsoll.record_sha256(record)
    assert none != vector["sha256"]
    record["session"]["origin"] = None
    assert plimsoll.record_sha256(record) == none
    # Field 14 is the last: the encoding without it is the vector's up to it.
    assert _digest.record_encoding(vector["input"]).startswith(_digest.record_encoding(record))
    record["session"]["origin"] = dict(vector["input"]["session"]["origin"], start="cloned")
    with pytest.raises(_digest.EncodingError, match="unknown session start"):
        plimsoll.record_sha256(record)
    record["session"]["origin"] = dict(vector["input"]["session"]["origin"], parent_calls=None)
    with pytest.raises(_digest.EncodingError, match="parent_calls"):
        plimsoll.record_sha256(record)


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda o: o.update(start="cloned"), "not restored or forked"),
        (lambda o: o.update(extra=1), "unknown members: extra"),
        (lambda o: o.pop("parent_calls"), "lacks `parent_calls`"),
        (lambda o: o.update(parent_calls=-1), "not an integer in range"),
        (lambda o: o.update(parent_session_id="ses_x"), "not a session id"),
        (lambda o: o.update(snapshot_sha256="A1" * 32), "64 lowercase hex"),
        (lambda o: o.update(parent_record_sha256="x"), "64 lowercase hex"),
    ],
)
def test_an_origin_is_read_strictly(edit: Callable[[dict], Any], says: str) -> None:
    record = copy.deepcopy(BY_NAME["record/forked-call"]["input"])
    edit(record["session"]["origin"])
    with pytest.raises(_types.WireError, match=says):
        plimsoll.RunRecord.from_wire(record)
    info = _info(origin=record["session"]["origin"])
    with pytest.raises(_types.WireError, match=says):
        plimsoll.SessionInfo.from_wire(info)


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda s: s.update(extra=1), "unknown members: extra"),
        (lambda s: s.update(snapshot_id="ses_0123456789abcdef_" + "cd" * 16), "not a snapshot id"),
        (lambda s: s.update(snapshot_id=SNAP_ID + "0"), "not a snapshot id"),
        (lambda s: s.update(session_id="snp_x"), "not a session id"),
        (lambda s: s.update(sha256="a1" * 31), "64 lowercase hex"),
        (lambda s: s.update(last_record_sha256="z" * 64), "64 lowercase hex"),
        (lambda s: s.update(language="ruby"), "not javascript or python"),
        (lambda s: s.update(isolation="hypervisor"), "not a tier"),
        (lambda s: s.pop("calls"), "lacks `calls`"),
        (lambda s: s.update(bytes=True), "not an integer in range"),
    ],
)
def test_a_snapshot_is_read_strictly(edit: Callable[[dict], Any], says: str) -> None:
    snap = _snap("r-1")
    assert plimsoll.SnapshotInfo.from_wire(snap).snapshot_id == SNAP_ID
    edit(snap)
    with pytest.raises(_types.WireError, match=says):
        plimsoll.SnapshotInfo.from_wire(snap)
    with pytest.raises(_types.WireError, match=says):
        plimsoll.SnapshotList.from_wire({"protocol": 1, "snapshots": [_snap(None), snap]})
    with pytest.raises(_types.WireError, match=says):
        plimsoll.ForkAnswer.from_wire(dict(_fork("r-1"), snapshot=snap))


def test_lists_and_fork_answers_are_read() -> None:
    listed = plimsoll.SnapshotList.from_wire({"protocol": 1, "snapshots": [_snap(None)]})
    assert len(listed) == 1 and listed.get(SNAP_ID) is not None and listed.get("x") is None
    assert listed.snapshots[0].request_id is None
    answer = plimsoll.ForkAnswer.from_wire(_fork("r-1"))
    assert [s.session_id for s in answer.sessions] == COPIES[:2]
    assert answer.sessions[0].origin == plimsoll.SessionOrigin(
        SessionStart.FORKED, SNAP_SHA, SID, 2, LAST
    )
    for bad in (dict(_fork("r-1"), extra=1), {k: v for k, v in _fork("r-1").items() if k != "sessions"}):
        with pytest.raises(_types.WireError):
            plimsoll.ForkAnswer.from_wire(bad)


# --- requests refused unsent ------------------------------------------------------------


def test_snapshot_requests_are_checked_before_anything_is_sent() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    snap = plimsoll.SnapshotInfo.from_wire(_snap("r-1"))
    with plimsoll.Client(url, "t") as c:
        s = plimsoll.Session(c, _parent(), _parent_chain())
        for call in (
            lambda: s.fork(0),
            lambda: s.fork(-2),
            lambda: s.fork(True),
            lambda: s.fork(1 << 32),
            lambda: s.fork("4"),  # type: ignore[arg-type]
            lambda: c.open_snapshot("snp_../../v1/runs"),
            lambda: c.open_snapshot(SID),
            lambda: c.open_snapshot(SNAP_ID, sha256="A1" * 32),
            lambda: c.open_snapshot(SNAP_ID, sha256="a1"),
            lambda: c.open_snapshot(snap, sha256="b" * 64),  # not the snapshot's own digest
            lambda: c.delete_snapshot("x"),
        ):
            with pytest.raises(plimsoll.InvalidRequest) as e:
                call()
            assert plimsoll.not_dispatched_reason(e.value) is Reason.REQUEST
        # A chain in doubt sends no snapshot or fork either: the copies would hang from a
        # point this client does not know.
        s._chain.doubt("r-earlier")
        for call in (s.snapshot, lambda: s.fork(1)):
            with pytest.raises(plimsoll.ChainInDoubt):
                call()
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


def test_the_requests_carry_what_the_daemon_reads() -> None:
    p = _session.prepare_fork(4)
    assert json.loads(p.body) == {"protocol": 1, "request_id": p.request_id, "count": 4}
    p = _session.prepare_snapshot()
    assert json.loads(p.body) == {"protocol": 1, "request_id": p.request_id}
    r = _session.prepare_restore(SNAP_ID, None)
    assert json.loads(r.body) == {"protocol": 1, "request_id": r.request_id}
    assert (r.snapshot_id, r.sha256, r.known) == (SNAP_ID, None, None)
    # Given the snapshot, its digest is named: a snapshot whose files changed is refused.
    snap = plimsoll.SnapshotInfo.from_wire(_snap("r-1"))
    r = _session.prepare_restore(snap, None)
    assert json.loads(r.body)["sha256"] == SNAP_SHA and r.known == snap
    assert _session.prepare_restore(snap, SNAP_SHA).sha256 == SNAP_SHA
    assert _session.snapshots_url("http://d", SNAP_ID, "/sessions") == (
        f"http://d/v1/snapshots/{SNAP_ID}/sessions"
    )


# --- answers ----------------------------------------------------------------------------


def test_a_snapshot_answer_is_this_requests_and_of_this_session_where_its_chain_stands() -> None:
    p = _session.prepare_snapshot()
    chain = _parent_chain()

    def read(**over: Any) -> plimsoll.SnapshotInfo:
        return _session.read_snapshot(p, chain, 200, json.dumps(_snap(p.request_id, **over)).encode())

    assert read().calls == 2
    with pytest.raises(plimsoll.RequestIdMismatch):
        read(request_id="r-other")
    with pytest.raises(plimsoll.RequestIdMismatch):
        read(request_id=None)
    with pytest.raises(plimsoll.BadResponse):
        read(protocol=2)
    for over, field in (
        ({"session_id": COPIES[0]}, "snapshot.session_id"),
        ({"provider": "runc"}, "snapshot.provider"),
        ({"isolation": "kernel"}, "snapshot.isolation"),
        ({"language": "javascript"}, "snapshot.language"),
        ({"calls": 1}, "snapshot.calls"),
        ({"last_record_sha256": "0" * 64}, "snapshot.last_record_sha256"),
        ({"last_record_sha256": None}, "snapshot.last_record_sha256"),
    ):
        with pytest.raises(plimsoll.ChainMismatch) as e:
            read(**over)
        assert e.value.field == field and plimsoll.not_dispatched_reason(e.value) is None


def test_refusals_are_believed_only_with_our_id() -> None:
    def answer(rid: Optional[str], code: str, mark: Optional[str]) -> bytes:
        err = {"code": code, "message": "no such snapshot of this caller", "not_dispatched": mark}
        return json.dumps({"protocol": 1, "request_id": rid, "error": err}).encode()

    p = _session.prepare_snapshot()
    for status, code, reason in (
        (404, "snapshot_not_found", Reason.REQUEST),
        (422, "unsupported", Reason.UNSUPPORTED),
        (429, "capacity", Reason.CAPACITY),
    ):
        with pytest.raises(plimsoll.NotDispatched) as e:
            _session.read_snapshot(p, _parent_chain(), status, answer(p.request_id, code, reason.value))
        assert (e.value.code, e.value.reason, e.value.status) == (code, reason, status)
        with pytest.raises(plimsoll.UnverifiedRefusal):
            _session.read_snapshot(p, _parent_chain(), status, answer("r-other", code, reason.value))
    r = _session.prepare_restore(SNAP_ID, None)
    with pytest.raises(plimsoll.NotDispatched) as nd:
        _session.read_restored(r, 404, answer(r.request_id, "snapshot_not_found", "request"))
    assert nd.value.code == "snapshot_not_found"
    f = _session.prepare_fork(2)
    with pytest.raises(plimsoll.DaemonFailed):
        _session.read_fork(f, 500, answer(f.request_id, "sandbox_failed", None))
    with pytest.raises(plimsoll.UnverifiedRefusal):
        _session.read_deleted("r-d", SNAP_ID, 404, answer(None, "snapshot_not_found", "request"))
    # A listing runs nothing: its failure is a SessionsError with the daemon's code.
    with pytest.raises(plimsoll.SessionsError) as s:
        _session.read_snapshot_list("u", 401, answer(None, "permission", "permission"))
    assert (s.value.code, s.value.status) == ("permission", 401)


def test_a_delete_answers_for_the_snapshot_deleted() -> None:
    ok = json.dumps(_snap("r-d")).encode()
    assert _session.read_deleted("r-d", SNAP_ID, 200, ok).snapshot_id == SNAP_ID
    with pytest.raises(plimsoll.RequestIdMismatch):
        _session.read_deleted("r-other", SNAP_ID, 200, ok)
    with pytest.raises(plimsoll.BadResponse, match="not snp_"):
        _session.read_deleted("r-d", "snp_0123456789abcdef_" + "00" * 16, 200, ok)


def _edit_copy(i: int, **over: Any) -> Callable[[dict], None]:
    def edit(answer: dict) -> None:
        answer["sessions"][i] = _copy(answer["request_id"], COPIES[i], **over)

    return edit


def _edit_origin(i: int, **over: Any) -> Callable[[dict], None]:
    def edit(answer: dict) -> None:
        answer["sessions"][i]["origin"].update(over)

    return edit


@pytest.mark.parametrize(
    "edit, error, field",
    [
        # Each copy hangs from the snapshot taken of this session, where its chain stands.
        (_edit_origin(1, parent_session_id=COPIES[3]), plimsoll.ChainMismatch, "origin.parent_session_id"),
        (_edit_origin(0, snapshot_sha256="b" * 64), plimsoll.ChainMismatch, "origin.snapshot_sha256"),
        (_edit_origin(1, parent_calls=1), plimsoll.ChainMismatch, "origin.parent_calls"),
        (_edit_origin(1, parent_record_sha256="0" * 64), plimsoll.ChainMismatch, "origin.parent_record_sha256"),
        (_edit_origin(0, start="restored"), plimsoll.ChainMismatch, "origin.start"),
        (_edit_copy(1, origin=None), plimsoll.ChainMismatch, "origin"),
        # Its own chain starts there.
        (_edit_copy(1, calls=0, last_record_sha256=None), plimsoll.ChainMismatch, "calls"),
        (_edit_copy(0, last_record_sha256="0" * 64), plimsoll.ChainMismatch, "last_record_sha256"),
        # The snapshot is of this session, after its last call.
        (lambda a: a["snapshot"].update(session_id=COPIES[2]), plimsoll.ChainMismatch, "snapshot.session_id"),
        (lambda a: a["snapshot"].update(calls=3), plimsoll.ChainMismatch, "snapshot.calls"),
        # In the session's sandbox.
        (_edit_copy(0, provider="runc"), plimsoll.ProviderMismatch, None),
        (_edit_copy(0, isolation="process", minimum_isolation="process"), plimsoll.EvidenceMismatch, None),
        (_edit_copy(1, minimum_isolation="process"), plimsoll.RecordMismatch, "minimum_isolation"),
        (_edit_copy(1, language="javascript"), plimsoll.BadResponse, None),
        (_edit_copy(1, image={"name": "sandbox", "identity": "sha256:" + "2" * 64}), plimsoll.BadResponse, None),
        (_edit_copy(1, end_reason="closed"), plimsoll.BadResponse, None),
        # As many new sessions as asked, each its own.
        (lambda a: a["sessions"].pop(), plimsoll.BadResponse, None),
        (lambda a: a["sessions"].__setitem__(1, a["sessions"][0]), plimsoll.BadResponse, None),
        (_edit_copy(1, session_id=SID), plimsoll.BadResponse, None),
    ],
)
def test_a_fork_answers_copies_are_checked(
    edit: Callable[[dict], None], error: type, field: Optional[str]
) -> None:
    p = _session.prepare_fork(2)
    chain = _parent_chain()
    honest = _fork(p.request_id)
    answer = _session.read_fork(p, 200, json.dumps(honest).encode())
    assert _session.check_fork(p, chain, answer) is None
    edit(honest)
    answer = _session.read_fork(p, 200, json.dumps(honest).encode())
    wrong = _session.check_fork(p, chain, answer)
    assert isinstance(wrong, error), wrong
    if field is not None:
        assert wrong.field == field  # type: ignore[attr-defined]
    assert plimsoll.not_dispatched_reason(wrong) is None


def test_a_fork_answer_is_this_requests_throughout() -> None:
    p = _session.prepare_fork(2)
    for edit in (
        lambda a: a.update(request_id="r-other"),
        lambda a: a["snapshot"].update(request_id="r-other"),
        lambda a: a["snapshot"].pop("request_id"),
        lambda a: a["sessions"][1].update(request_id="r-other"),
    ):
        answer = _fork(p.request_id)
        edit(answer)
        with pytest.raises(plimsoll.RequestIdMismatch):
            _session.read_fork(p, 200, json.dumps(answer).encode())
    with pytest.raises(plimsoll.BadResponse):
        _session.read_fork(p, 200, json.dumps(dict(_fork(p.request_id), protocol=2)).encode())


def test_a_copy_of_a_session_that_named_an_image_must_run_in_it() -> None:
    image = {"name": "python-data", "identity": "sha256:" + "5" * 64}
    parent = plimsoll.SessionInfo.from_wire(_info(calls=2, last_record_sha256=LAST, image=image))
    chain = Chain(parent, 2, LAST, "python-data")
    p = _session.prepare_fork(1)
    answer = _fork(p.request_id, 1)
    answer["sessions"][0]["image"] = image
    assert _session.check_fork(p, chain, plimsoll.ForkAnswer.from_wire(answer)) is None
    for other in (None, {"name": "sandbox", "identity": "sha256:" + "2" * 64}):
        answer["sessions"][0]["image"] = other
        if other is None:
            del answer["sessions"][0]["image"]
        wrong = _session.check_fork(p, chain, plimsoll.ForkAnswer.from_wire(answer))
        assert isinstance(wrong, plimsoll.ImageMismatch) and "the copy" in str(wrong)


def test_a_restored_session_is_checked_against_what_was_named() -> None:
    snap = plimsoll.SnapshotInfo.from_wire(_snap(None))

    def problem(p: _session.PreparedRestore, **over: Any) -> Any:
        over.setdefault("origin", _origin("restored"))
        info = _session.read_restored(p, 200, json.dumps(_copy(p.request_id, COPIES[0], **over)).encode())
        return _session.check_restored(p, info)

    for named in (snap, SNAP_ID):
        assert problem(_session.prepare_restore(named, None)) is None
    assert problem(_session.prepare_restore(SNAP_ID, SNAP_SHA)) is None
    # From its id alone, another digest is all the client can tell; given the snapshot, its
    # session and the point of its chain too.
    for named, origin, field in (
        (SNAP_ID, _origin("forked"), "origin.start"),
        (SNAP_ID, None, "origin"),
        (snap, _origin("restored", parent_session_id=COPIES[1]), "origin.parent_session_id"),
        (snap, _origin("restored", parent_calls=1), "origin.parent_calls"),
        (snap, _origin("restored", snapshot_sha256="b" * 64), "origin.snapshot_sha256"),
    ):
        wrong = problem(_session.prepare_restore(named, None), origin=origin)
        assert isinstance(wrong, plimsoll.ChainMismatch) and wrong.field == field, wrong
    assert problem(
        _session.prepare_restore(SNAP_ID, None), origin=_origin("restored", parent_session_id=COPIES[1])
    ) is None
    wrong = problem(_session.prepare_restore(SNAP_ID, SNAP_SHA), origin=_origin("restored", snapshot_sha256="b" * 64))
    assert isinstance(wrong, plimsoll.ChainMismatch) and wrong.field == "origin.snapshot_sha256"
    wrong = problem(_session.prepare_restore(snap, None), provider="runc")
    assert isinstance(wrong, plimsoll.ProviderMismatch)
    wrong = problem(_session.prepare_restore(SNAP_ID, None), isolation="process", minimum_isolation="container")
    assert isinstance(wrong, plimsoll.EvidenceMismatch)
    r = _session.prepare_restore(SNAP_ID, None)
    with pytest.raises(plimsoll.RequestIdMismatch):
        _session.read_restored(r, 200, json.dumps(_copy("r-other", COPIES[0], "restored")).encode())


def test_a_fresh_session_has_no_origin() -> None:
    p = _session.prepare_open("python", minimum_isolation="container")
    p = _session.PreparedOpen("r-open", p.body, p.language, p.floor, p.provider)
    info = _session.read_opened(p, 200, json.dumps(_info(origin=_origin())).encode())
    wrong = _session.check_opened(p, info, None)
    assert isinstance(wrong, plimsoll.BadResponse) and "forked from a snapshot" in str(wrong)
    with pytest.raises(plimsoll.SessionsError, match="fewer than"):
        _session.read_shown("u", SID, 200, json.dumps(_info(calls=1, last_record_sha256=LAST, origin=_origin())).encode())


# --- the chain of a copy ----------------------------------------------------------------


def _copy_info() -> plimsoll.SessionInfo:
    return plimsoll.SessionInfo.from_wire(_copy("r-1", SID))


def test_a_copys_chain_goes_on_from_its_parents_and_every_record_carries_its_origin() -> None:
    info = _copy_info()
    chain = _session.copy_chain(info)
    assert (chain.sequence, chain.previous) == (2, LAST)
    p = _verify_cell()
    # Its first call is sequence 3, after the parent's call 2, with its origin.
    r = chain.follow(p, _verified(p, _call(p, 3, LAST, session=_link(3, LAST, _origin()))))
    assert r.record.session is not None and r.record.session.origin == info.origin
    assert (chain.sequence, chain.previous) == (3, r.record.record_sha256)
    p = _verify_cell()
    for origin in (
        None,
        _origin(parent_calls=1),
        _origin(parent_session_id=COPIES[1]),
        _origin(snapshot_sha256="b" * 64),
        _origin(parent_record_sha256="0" * 64),
        _origin(parent_record_sha256=None),
        _origin("restored"),
    ):
        bad = _call(p, 4, chain.previous, session=_link(4, chain.previous, origin))
        with pytest.raises(plimsoll.ChainMismatch) as e:
            chain.follow(p, _verified(p, bad))
        assert e.value.field == "origin" and plimsoll.not_dispatched_reason(e.value) is None
        assert (chain.sequence, chain.previous) == (3, r.record.record_sha256)
    # A fresh session's record never carries one.
    fresh = Chain(plimsoll.SessionInfo.from_wire(_info()), 0, None)
    p = _verify_cell()
    with pytest.raises(plimsoll.ChainMismatch, match="origin"):
        fresh.follow(p, _verified(p, _call(p, 1, None, session=_link(1, None, _origin()))))
    # The origin is fixed for the session's life: a resync that shows another is refused.
    chain.resync(plimsoll.SessionInfo.from_wire(_copy("r-2", SID, calls=5, last_record_sha256="c" * 64)))
    assert (chain.sequence, chain.previous) == (5, "c" * 64)
    with pytest.raises(plimsoll.SessionsError, match="origin"):
        chain.resync(plimsoll.SessionInfo.from_wire(_info(calls=5, last_record_sha256="c" * 64)))


def _link(
    sequence: int, previous: Optional[str], origin: Optional[dict], session_id: str = SID
) -> dict[str, Any]:
    link: dict[str, Any] = {"session_id": session_id, "sequence": sequence}
    if previous is not None:
        link["previous_record_sha256"] = previous
    if origin is not None:
        link["origin"] = origin
    return link


def _verify_cell() -> _verify.Prepared:
    return _session.prepare_call(
        plimsoll.Snippet("python", "print(1)"), timeout_ms=None, max_body_bytes=1 << 20
    )


# --- through a fake daemon --------------------------------------------------------------


class FakeDaemon:
    """A loopback HTTP server answering as ``answer(method, path, headers, body)`` says
    (``(status, JSON value)``), remembering every request it was sent."""

    def __init__(self, answer: Callable[[str, str, Any, bytes], tuple[int, Any]]) -> None:
        self.seen: list[tuple[str, str]] = []
        self.bodies: list[bytes] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                fake.seen.append((self.command, self.path))
                fake.bodies.append(body)
                status, value = answer(self.command, self.path, self.headers, body)
                out = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(out)
                self.close_connection = True

            do_GET = do_POST = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> "FakeDaemon":
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _closing(close_status: int) -> Callable[[str, str, Any, bytes], Optional[tuple[int, Any]]]:
    """Answers a session's close (DELETE) as the daemon does, or with ``close_status``'s
    failure."""

    def close(method: str, path: str, headers: Any, body: bytes) -> Optional[tuple[int, Any]]:
        if method != "DELETE":
            return None
        rid = headers.get("plimsoll-request-id")
        if close_status != 200:
            return close_status, {"protocol": 1, "request_id": rid, "error": {"code": "internal", "message": "m"}}
        sid = path.rsplit("/", 1)[1]
        return 200, _info(request_id=rid, session_id=sid, end_reason="closed")

    return close


@pytest.mark.parametrize("close_status", [200, 500])
def test_a_fork_whose_copy_names_another_parent_is_rejected_and_its_copies_closed(
    close_status: int,
) -> None:
    close = _closing(close_status)

    def answer(method: str, path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        closed = close(method, path, headers, body)
        if closed is not None:
            return closed
        assert (method, path) == ("POST", f"/v1/sessions/{SID}/fork")
        fork = _fork(json.loads(body)["request_id"], 4)
        fork["sessions"][2]["origin"]["parent_session_id"] = COPIES[0]
        return 200, fork

    with FakeDaemon(answer) as fake, plimsoll.Client(fake.url, "t") as c:
        parent = plimsoll.Session(c, _parent(), _parent_chain())
        with pytest.raises(plimsoll.ChainMismatch) as e:
            parent.fork(4)
        assert (e.value.field, e.value.expected, e.value.got) == (
            "origin.parent_session_id",
            SID,
            COPIES[0],
        )
        assert e.value.session_id == COPIES[2] and plimsoll.not_dispatched_reason(e.value) is None
        # Every copy of the refused answer was closed again; a close that failed is kept.
        assert fake.seen[1:] == [("DELETE", f"/v1/sessions/{sid}") for sid in COPIES]
        if close_status == 200:
            assert e.value.close_error is None
        else:
            assert isinstance(e.value.close_error, plimsoll.DaemonFailed)
        # The parent's chain did not move: a snapshot sends nothing of it.
        assert (parent.info.calls, parent.in_doubt) == (2, None)


@pytest.mark.asyncio
async def test_asyncio_rejects_a_fork_whose_copy_names_another_parent() -> None:
    close = _closing(200)

    def answer(method: str, path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        closed = close(method, path, headers, body)
        if closed is not None:
            return closed
        fork = _fork(json.loads(body)["request_id"], 2)
        fork["sessions"][0]["origin"]["parent_session_id"] = COPIES[3]
        return 200, fork

    with FakeDaemon(answer) as fake:
        async with plimsoll.AsyncClient(fake.url, "t") as c:
            parent = plimsoll.AsyncSession(c, _parent(), _parent_chain())
            with pytest.raises(plimsoll.ChainMismatch) as e:
                await parent.fork(2)
            assert e.value.field == "origin.parent_session_id"
            assert sorted(fake.seen[1:]) == [("DELETE", f"/v1/sessions/{sid}") for sid in COPIES[:2]]


def test_a_fork_answered_honestly_hands_out_copies_that_go_on_from_the_parent() -> None:
    def answer(method: str, path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        request = json.loads(body)
        if path.endswith("/fork"):
            return 200, _fork(request["request_id"], 2)
        assert path == f"/v1/sessions/{COPIES[1]}/cells"
        p = SimpleNamespace(request_id=request["request_id"], sent=request)
        return 200, _call(p, 3, LAST, session=_link(3, LAST, _origin(), COPIES[1]))  # type: ignore[arg-type]

    with FakeDaemon(answer) as fake, plimsoll.Client(fake.url, "t") as c:
        snap, copies = plimsoll.Session(c, _parent(), _parent_chain()).fork(2)
        assert snap.snapshot_id == SNAP_ID and [cp.id for cp in copies] == COPIES[:2]
        r = copies[1].cell("print(1)")
        assert r.record.session is not None and r.record.session.sequence == 3
        assert copies[1].info.calls == 3


def test_a_restored_sessions_call_whose_origin_is_not_its_sessions_is_rejected() -> None:
    origin = {"o": _origin("restored")}

    def answer(method: str, path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        request = json.loads(body)
        if path == f"/v1/snapshots/{SNAP_ID}/sessions":
            return 200, _copy(request["request_id"], COPIES[0], "restored")
        p = SimpleNamespace(request_id=request["request_id"], sent=request)
        return 200, _call(p, 3, LAST, session=_link(3, LAST, origin["o"], COPIES[0]))  # type: ignore[arg-type]

    snap = plimsoll.SnapshotInfo.from_wire(_snap(None))
    with FakeDaemon(answer) as fake, plimsoll.Client(fake.url, "t") as c:
        restored = c.open_snapshot(snap)
        assert json.loads(fake.bodies[0])["sha256"] == SNAP_SHA  # the snapshot's digest named
        assert restored.info.origin is not None and restored.info.calls == 2
        origin["o"] = _origin("restored", parent_calls=1)
        with pytest.raises(plimsoll.ChainMismatch) as e:
            restored.cell("print(1)")
        assert e.value.field == "origin" and restored.in_doubt == e.value.request_id
        fresh = plimsoll.Session(c, restored.info, _session.copy_chain(restored.info))
        origin["o"] = _origin("restored")
        assert fresh.cell("print(1)").record.session.sequence == 3  # type: ignore[union-attr]


# --- a session that outlives a daemon restart --------------------------------------------
# On SIGTERM the daemon saves each runsc session, and the next daemon restores it under the
# same id: from the call after the last one saved, its records carry that restore as their
# origin (parent: the session itself, at that call and record), and its tier and evidence
# are the restoring daemon's. Nowhere else may a session's origin change.

RESTORED_SHA = "5e" * 32
NEW_EVIDENCE = "d" * 64


def _restored_here(calls: int, record: Optional[str], **over: Any) -> dict[str, Any]:
    """The origin of session SID restored under its own id after its call ``calls``."""
    o: dict[str, Any] = dict(
        parent_session_id=SID,
        parent_calls=calls,
        parent_record_sha256=record,
        snapshot_sha256=RESTORED_SHA,
    )
    o.update(over)
    return _origin("restored", **o)


def _restart_call(
    p: _verify.Prepared,
    sequence: int,
    previous: Optional[str],
    origin: Optional[dict],
    **record_over: Any,
) -> plimsoll.RunResponse:
    """Session SID's call at ``sequence`` carrying ``origin``, run at kernel tier under the
    restoring daemon's evidence unless ``record_over`` says otherwise."""
    record_over.setdefault("isolation", "kernel")
    record_over.setdefault("evidence_sha256", NEW_EVIDENCE)
    return _verified(p, _call(p, sequence, previous, session=_link(sequence, previous, origin), **record_over))


def _one_call_chain() -> tuple[Chain, str]:
    """A fresh session's chain after its call 1 (no origin), and that call's record digest."""
    chain = Chain(plimsoll.SessionInfo.from_wire(_info()), 0, None)
    p = _verify_cell()
    r1 = chain.follow(p, _verified(p, _call(p, 1, None)))
    return chain, r1.record.record_sha256


def test_a_restore_under_its_own_id_is_taken_at_the_call_after_the_last_seen() -> None:
    chain, r1 = _one_call_chain()
    p = _verify_cell()
    r2 = chain.follow(p, _restart_call(p, 2, r1, _restored_here(1, r1)))
    # From here the session's origin, tier and evidence are the restore's.
    o = chain.info.origin
    assert o is not None and o.start is SessionStart.RESTORED and o.parent_session_id == SID
    assert (o.parent_calls, o.parent_record_sha256, o.snapshot_sha256) == (1, r1, RESTORED_SHA)
    assert (chain.info.isolation, chain.info.evidence_sha256) == (Tier.KERNEL, NEW_EVIDENCE)
    assert (chain.sequence, chain.previous, chain.info.calls) == (2, r2.record.record_sha256, 2)
    assert chain.info.provider == "crun" and chain.info.environment == "sha256:" + "1" * 64
    # The next call carries the same origin, at the new tier and evidence.
    p = _verify_cell()
    r3 = chain.follow(p, _restart_call(p, 3, chain.previous, _restored_here(1, r1)))
    assert chain.sequence == 3
    # A later record whose origin reverts, or names the restore at another call, or whose
    # tier or evidence go back: refused, the chain where it was.
    p = _verify_cell()
    for origin, over, field in (
        (None, {}, "origin"),
        (None, {"isolation": "container", "evidence_sha256": EVIDENCE}, "origin"),
        (_restored_here(2, r2.record.record_sha256), {}, "origin"),
        (_restored_here(1, r1), {"isolation": "container"}, "isolation"),
        (_restored_here(1, r1), {"evidence_sha256": EVIDENCE}, "evidence_sha256"),
        (_restored_here(1, r1), {"provider": "runc"}, "provider"),
    ):
        with pytest.raises(plimsoll.ChainMismatch) as e:
            chain.follow(p, _restart_call(p, 4, chain.previous, origin, **over))
        assert e.value.field == field and plimsoll.not_dispatched_reason(e.value) is None
        assert (chain.sequence, chain.previous) == (3, r3.record.record_sha256)
        assert chain.info.origin == o
    # Another restart, after call 3: the next restore's origin is taken there, back at the
    # first daemon's tier and evidence.
    r3d = r3.record.record_sha256
    chain.follow(p, _restart_call(p, 4, r3d, _restored_here(3, r3d), isolation="container", evidence_sha256=EVIDENCE))
    assert chain.info.origin is not None and chain.info.origin.parent_calls == 3
    assert (chain.info.isolation, chain.info.evidence_sha256) == (Tier.CONTAINER, EVIDENCE)


@pytest.mark.parametrize(
    "origin, over, field",
    [
        # Off by one either way: not the call after the last one this client saw.
        (lambda r1: _restored_here(0, None), {}, "origin"),
        (lambda r1: _restored_here(2, r1), {}, "origin"),
        # Another session's restore, or a fork, or another parent record.
        (lambda r1: _restored_here(1, r1, parent_session_id=COPIES[0]), {}, "origin"),
        (lambda r1: _origin("forked", parent_calls=1, parent_record_sha256=r1), {}, "origin"),
        (lambda r1: _restored_here(1, "0" * 64), {}, "origin"),
        (lambda r1: _restored_here(1, None), {}, "origin"),
        # Its provider and environment stay the session's across a restore.
        (lambda r1: _restored_here(1, r1), {"provider": "runc"}, "provider"),
        (lambda r1: _restored_here(1, r1), {"environment": "elsewhere"}, "environment"),
        # Without a restore, the tier and evidence are the session's.
        (lambda r1: None, {}, "isolation"),
        (lambda r1: None, {"isolation": "container"}, "evidence_sha256"),
    ],
)
def test_no_other_change_of_origin_or_sandbox_is_taken(
    origin: Callable[[str], Optional[dict]], over: dict[str, Any], field: str
) -> None:
    chain, r1 = _one_call_chain()
    before = chain.info
    p = _verify_cell()
    with pytest.raises(plimsoll.ChainMismatch) as e:
        chain.follow(p, _restart_call(p, 2, r1, origin(r1), **over))
    assert e.value.field == field and plimsoll.not_dispatched_reason(e.value) is None
    assert (chain.sequence, chain.previous, chain.info) == (1, r1, before)


def test_a_restore_before_the_first_call_and_of_a_copy_are_taken() -> None:
    # Saved before its first call: the restore names call 0 and no record.
    chain = Chain(plimsoll.SessionInfo.from_wire(_info()), 0, None)
    p = _verify_cell()
    chain.follow(p, _restart_call(p, 1, None, _restored_here(0, None)))
    assert chain.info.origin is not None and chain.info.origin.parent_calls == 0
    # A forked copy (its chain at its parent's call 2) restored under its own id after its
    # call 3: the fork's origin gives way to the restore's, once.
    copy_info = plimsoll.SessionInfo.from_wire(
        _copy("r-1", SID, origin=_origin(parent_session_id=COPIES[0]))
    )
    chain = _session.copy_chain(copy_info)
    p = _verify_cell()
    forked = _origin(parent_session_id=COPIES[0])
    r3 = chain.follow(p, _verified(p, _call(p, 3, LAST, session=_link(3, LAST, forked))))
    r3d = r3.record.record_sha256
    p = _verify_cell()
    chain.follow(p, _restart_call(p, 4, r3d, _restored_here(3, r3d)))
    assert chain.info.origin is not None and chain.info.origin.start is SessionStart.RESTORED
    p = _verify_cell()
    with pytest.raises(plimsoll.ChainMismatch) as e:
        chain.follow(p, _restart_call(p, 5, chain.previous, forked))
    assert e.value.field == "origin"


def _shown(calls: int, last: Optional[str], origin: Optional[dict], **over: Any) -> plimsoll.SessionInfo:
    over.setdefault("isolation", "kernel")
    over.setdefault("evidence_sha256", NEW_EVIDENCE)
    return plimsoll.SessionInfo.from_wire(
        _info(request_id=None, calls=calls, last_record_sha256=last, origin=origin, **over)
    )


def test_resync_takes_a_restore_at_the_chain_it_knows_and_nothing_else() -> None:
    chain, r1 = _one_call_chain()
    # Refused: the restore after another call, of another session, a fork, another record;
    # a new tier or evidence without a restore; another provider even with one.
    for info, says in (
        (_shown(1, r1, _restored_here(0, None)), "origin restored"),
        (_shown(2, "c" * 64, _restored_here(2, "c" * 64)), "origin restored"),
        (_shown(1, r1, _restored_here(1, r1, parent_session_id=COPIES[0])), "origin restored"),
        (_shown(1, r1, _origin("forked", parent_calls=1, parent_record_sha256=r1)), "origin forked"),
        (_shown(1, r1, _restored_here(1, "0" * 64)), "origin restored"),
        (_shown(1, r1, None), "isolation kernel"),
        (_shown(1, r1, None, isolation="container"), "evidence_sha256"),
        (_shown(1, r1, _restored_here(1, r1), provider="runc"), "provider runc"),
    ):
        with pytest.raises(plimsoll.SessionsError, match=says):
            chain.resync(info)
        assert (chain.sequence, chain.previous, chain.info.origin) == (1, r1, None)
    # Taken: restored right after call 1, and a call made since (its answer lost here).
    chain.doubt("r-lost")
    chain.resync(_shown(2, "c" * 64, _restored_here(1, r1)))
    assert (chain.sequence, chain.previous, chain.in_doubt) == (2, "c" * 64, None)
    assert chain.info.origin is not None and chain.info.isolation is Tier.KERNEL
    # The next call carries the restore's origin, taken as the session's own now.
    p = _verify_cell()
    chain.follow(p, _restart_call(p, 3, "c" * 64, _restored_here(1, r1)))
    # A later show whose origin reverts, or whose tier goes back, is refused.
    for info, says in (
        (_shown(3, chain.previous, None), "origin"),
        (_shown(3, chain.previous, _restored_here(1, r1), isolation="container"), "isolation"),
    ):
        with pytest.raises(plimsoll.SessionsError, match=says):
            chain.resync(info)


def test_a_session_restored_by_a_restart_goes_on_through_a_fake_daemon() -> None:
    """A Session of a client, its calls and show answered by a loopback fake: call 1 before
    the restart, call 2 the first after it; then a call whose record drops the origin again
    is refused, and the resync that follows takes the daemon's word only at the restore."""
    calls: list[dict[str, Any]] = []
    state: dict[str, Any] = {"origin": None, "shown": None}

    def answer(method: str, path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        if method == "GET":
            assert path == f"/v1/sessions/{SID}"
            return 200, state["shown"]
        assert (method, path) == ("POST", f"/v1/sessions/{SID}/cells")
        request = json.loads(body)
        p = SimpleNamespace(request_id=request["request_id"], sent=request)
        n = len(calls) + 1
        previous = calls[-1]["record"]["record_sha256"] if calls else None
        over = {} if state["origin"] is None else {"isolation": "kernel", "evidence_sha256": NEW_EVIDENCE}
        a = _call(p, n, previous, session=_link(n, previous, state["origin"]), **over)  # type: ignore[arg-type]
        calls.append(a)
        return 200, a

    with FakeDaemon(answer) as fake, plimsoll.Client(fake.url, "t") as c:
        info = plimsoll.SessionInfo.from_wire(_info())
        s = plimsoll.Session(c, info, Chain(info, 0, None))
        r1 = s.cell("x = 41").record.record_sha256
        state["origin"] = _restored_here(1, r1)  # the daemon restarted
        r2 = s.cell("print(x + 1)")
        assert r2.record.session is not None and r2.record.session.sequence == 2
        assert s.info.origin is not None and s.info.origin.parent_record_sha256 == r1
        assert s.info.isolation is Tier.KERNEL
        state["origin"] = None  # its origin dropped again
        with pytest.raises(plimsoll.ChainMismatch) as e:
            s.cell("print(x)")
        assert e.value.field == "origin" and s.in_doubt == e.value.request_id
        r3 = calls[-1]["record"]["record_sha256"]
        state["shown"] = _info(request_id=None, calls=3, last_record_sha256=r3, origin=None,
                               isolation="kernel", evidence_sha256=NEW_EVIDENCE)
        with pytest.raises(plimsoll.SessionsError, match="origin"):
            s.resync()
        assert s.in_doubt is not None
        state["shown"] = _info(request_id=None, calls=3, last_record_sha256=r3,
                               origin=_restored_here(1, r1), isolation="kernel",
                               evidence_sha256=NEW_EVIDENCE)
        assert s.resync().calls == 3 and s.in_doubt is None
        state["origin"] = _restored_here(1, r1)
        assert s.cell("print(x)").record.session.sequence == 4  # type: ignore[union-attr]
