"""Snapshots and forks (docs/sessions.md) against a real plimsolld at runsc, sync and async: a
Python session holding `x = 41` snapshotted and going on, a session opened from the snapshot
and a fork into 4 copies, each printing 42 and a random number of its own, every record
verified by the client (its digest, field 14 included, and its place in a chain that goes on
from the parent's); the refusals (another caller's or an unknown snapshot, a JavaScript
session, a count out of range); and proxies that alter a fork's copies or a restored
session's records, caught every time. And a session that outlives a daemon restart: saved
on SIGTERM, restored by the next daemon under its own id, its chain going on across the
restore."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

import plimsoll
from plimsoll import Reason, SessionStart, Tier, not_dispatched_reason
from plimsoll._session import Chain

sys.path.insert(0, str(Path(__file__).parent))
from daemon import Daemon, add_caller  # noqa: E402
from proxy import Proxy  # noqa: E402

PROBE = "print(x + 1, random.random())"


def client(d: Daemon, url: Optional[str] = None) -> plimsoll.Client:
    return plimsoll.Client(url or d.url, d.token)


def record_wire(r: plimsoll.RunResponse) -> Any:
    return json.loads(r.body)["record"]


def check_link(
    r: plimsoll.RunResponse, session: plimsoll.Session, sequence: int, previous: Optional[str]
) -> None:
    """What the client already checked, seen from here: the call's place in its session's
    chain, the session's origin on its record, and the record digest over it (field 14)."""
    link = r.record.session
    assert link is not None and link.session_id == session.id
    assert (link.sequence, link.previous_record_sha256) == (sequence, previous)
    assert link.origin == session.info.origin
    wire = record_wire(r)
    assert plimsoll.record_sha256(wire) == r.record.record_sha256
    if link.origin is not None:
        # The origin is inside the digest: the record without it is another record.
        del wire["session"]["origin"]
        assert plimsoll.record_sha256(wire) != r.record.record_sha256


def probed(r: plimsoll.RunResponse) -> tuple[str, str]:
    x, random = r.stdout.text().split()
    return x, random


def test_a_session_is_snapshotted_restored_and_forked_with_fresh_randomness(
    snapshots: Daemon,
) -> None:
    with client(snapshots) as c, contextlib.ExitStack() as opened:
        parent = opened.enter_context(c.open_session("python", provider="runsc"))
        assert (parent.info.provider, parent.info.isolation, parent.info.origin) == (
            "runsc",
            Tier.KERNEL,
            None,
        )
        r1 = parent.cell("import random\nx = 41")
        assert r1.exit_code == 0, r1.stderr

        # A snapshot after call 1; the session goes on from it.
        snap = parent.snapshot()
        assert (snap.session_id, snap.calls, snap.last_record_sha256) == (
            parent.id,
            1,
            r1.record.record_sha256,
        )
        assert (snap.provider, snap.isolation, snap.language) == ("runsc", Tier.KERNEL, "python")
        assert snap.request_id is not None and snap.bytes > 0
        assert snap.created_unix_ms < snap.expires_unix_ms
        r2 = parent.cell("print(x + 1)")
        assert r2.stdout == b"42\n", r2.stderr
        check_link(r2, parent, 2, r1.record.record_sha256)

        # A session opened from the snapshot: x is there, its chain goes on from call 1.
        restored = opened.enter_context(c.open_snapshot(snap))
        origin = restored.info.origin
        assert origin is not None and origin.start is SessionStart.RESTORED
        assert (origin.parent_session_id, origin.snapshot_sha256) == (parent.id, snap.sha256)
        assert (origin.parent_calls, origin.parent_record_sha256) == (1, r1.record.record_sha256)
        assert restored.id != parent.id and restored.info.calls == 1
        rr = restored.cell("print(x + 1)")
        assert rr.stdout == b"42\n", rr.stderr
        check_link(rr, restored, 2, r1.record.record_sha256)
        rr2 = restored.cell("x = 7\nprint(x)")
        check_link(rr2, restored, 3, rr.record.record_sha256)

        # A fork into 4 after the parent's call 2.
        snap2, copies = parent.fork(4)
        for cp in copies:
            opened.enter_context(cp)
        assert (snap2.session_id, snap2.calls, snap2.last_record_sha256) == (
            parent.id,
            2,
            r2.record.record_sha256,
        )
        assert snap2.snapshot_id != snap.snapshot_id and len(copies) == 4
        assert len({cp.id for cp in copies} | {parent.id, restored.id}) == 6
        randoms = set()
        for cp in copies:
            o = cp.info.origin
            assert o is not None and o.start is SessionStart.FORKED
            assert (o.parent_session_id, o.snapshot_sha256) == (parent.id, snap2.sha256)
            assert (o.parent_calls, o.parent_record_sha256) == (2, r2.record.record_sha256)
            r = cp.cell(PROBE)
            assert r.exit_code == 0, r.stderr
            x, random = probed(r)
            assert x == "42"
            randoms.add(random)
            check_link(r, cp, 3, r2.record.record_sha256)
        print(f"the copies' random.random(): {sorted(randoms)}")
        assert len(randoms) == 4, f"every copy draws its own random numbers: {randoms}"
        # The parent, untouched by the fork and the restore, draws from its own state, and
        # what it changes no copy sees.
        r3 = parent.cell(PROBE + "\nx = 0")
        check_link(r3, parent, 3, r2.record.record_sha256)
        assert probed(r3)[0] == "42" and probed(r3)[1] not in randoms
        assert copies[0].cell("print(x)").stdout == b"41\n"
        assert restored.cell("print(x)").stdout == b"7\n"

        # Listed oldest first; deleted, its id is unknown, and the sessions from it go on.
        listed = c.list_snapshots()
        assert [s.snapshot_id for s in listed] == [snap.snapshot_id, snap2.snapshot_id]
        assert listed.get(snap.snapshot_id) == dataclasses.replace(snap, request_id=None)
        gone = c.delete_snapshot(snap)
        assert gone.snapshot_id == snap.snapshot_id and gone.request_id not in (None, snap.request_id)
        assert [s.snapshot_id for s in c.list_snapshots()] == [snap2.snapshot_id]
        with pytest.raises(plimsoll.NotDispatched) as e:
            c.open_snapshot(snap)
        assert (e.value.code, e.value.status, e.value.reason) == (
            "snapshot_not_found",
            404,
            Reason.REQUEST,
        )
        assert restored.cell("print(x)").stdout == b"7\n"

        # By its id, naming another digest: refused, nothing opened.
        open_before = len(c.list_sessions())
        with pytest.raises(plimsoll.NotDispatched) as e:
            c.open_snapshot(snap2.snapshot_id, sha256="0" * 64)
        assert (e.value.reason, e.value.status) == (Reason.REQUEST, 400)
        assert len(c.list_sessions()) == open_before
        # By its id and its digest: a session that says it was restored from it.
        again = opened.enter_context(c.open_snapshot(snap2.snapshot_id, sha256=snap2.sha256))
        assert again.info.origin is not None and again.info.origin.parent_calls == 2
        assert probed(again.cell(PROBE))[0] == "42"
        c.delete_snapshot(snap2.snapshot_id)
        assert len(c.list_snapshots()) == 0
    with client(snapshots) as c:
        assert c.list_sessions().sessions == []


def test_another_callers_snapshot_is_not_found_as_an_unknown_one(snapshots: Daemon) -> None:
    other_token = add_caller(snapshots.dir / "callers.toml", "pytest-other")
    with client(snapshots) as c, plimsoll.Client(snapshots.url, other_token) as other:
        with c.open_session("python", provider="runsc") as mine:
            mine.cell("secret = 7")
            snap = mine.snapshot()
            unknown = snap.snapshot_id[:21] + "0" * 32
            refusals = []
            for attempt in (
                lambda: other.open_snapshot(snap),
                lambda: other.open_snapshot(snap.snapshot_id),
                lambda: other.open_snapshot(unknown),
                lambda: other.delete_snapshot(snap),
                lambda: c.open_snapshot(unknown),
                lambda: c.delete_snapshot(unknown),
            ):
                with pytest.raises(plimsoll.NotDispatched) as e:
                    attempt()
                assert (e.value.code, e.value.status, e.value.reason) == (
                    "snapshot_not_found",
                    404,
                    Reason.REQUEST,
                )
                assert not_dispatched_reason(e.value) is Reason.REQUEST
                refusals.append(e.value.detail)
            assert len(set(refusals)) == 1, "another caller's snapshot is answered as an unknown one"
            assert other.list_snapshots().snapshots == []
            # Nor can the other caller snapshot or fork my session, even knowing its id.
            forged = plimsoll.Session(other, mine.info, Chain(mine.info, 1, mine.info.last_record_sha256))
            for attempt in (forged.snapshot, lambda: forged.fork(1)):
                with pytest.raises(plimsoll.NotDispatched) as e:
                    attempt()
                assert (e.value.code, e.value.status) == ("session_not_found", 404)
            # Mine is untouched, and so is my snapshot.
            assert [s.snapshot_id for s in c.list_snapshots()] == [snap.snapshot_id]
            with c.open_snapshot(snap) as back:
                assert back.cell("print(secret)").stdout == b"7\n"
            c.delete_snapshot(snap)
        with pytest.raises(plimsoll.InvalidRequest):
            c.open_snapshot("../../v1/runs")


def test_what_cannot_be_snapshotted_honestly_is_refused_and_the_session_goes_on(
    snapshots: Daemon,
) -> None:
    with client(snapshots) as c:
        # JavaScript: node's generator cannot be re-seeded, so copies would repeat it.
        with c.open_session("javascript", provider="runsc") as js:
            js.cell("var n = 41")
            for attempt in (js.snapshot, lambda: js.fork(1)):
                with pytest.raises(plimsoll.NotDispatched) as e:
                    attempt()
                assert (e.value.reason, e.value.status) == (Reason.UNSUPPORTED, 422)
                assert "JavaScript" in e.value.detail
            assert js.cell("console.log(n + 1)").stdout == b"42\n"
        assert c.list_snapshots().snapshots == []
        with c.open_session("python", provider="runsc") as py:
            # A count the client cannot send, and one over the daemon's max_fork (8).
            for count in (0, -1, True, 1 << 32):
                with pytest.raises(plimsoll.InvalidRequest):
                    py.fork(count)
            with pytest.raises(plimsoll.NotDispatched) as e:
                py.fork(9)
            assert (e.value.reason, e.value.status) == (Reason.REQUEST, 400)
            assert "max_fork" in e.value.detail
            # Over the session limits (8 here, 1 open): nothing is taken.
            with pytest.raises(plimsoll.NotDispatched) as e:
                py.fork(8)
            assert (e.value.reason, e.value.status) == (Reason.CAPACITY, 429)
            assert c.list_snapshots().snapshots == [] and len(c.list_sessions()) == 1
            assert py.cell("print(6 * 7)").stdout == b"42\n"


@pytest.mark.asyncio
async def test_async_snapshots_and_forks(snapshots: Daemon) -> None:
    async with plimsoll.AsyncClient(snapshots.url, snapshots.token) as c:
        async with await c.open_session("python", provider="runsc") as parent:
            first = await parent.cell("import random\nx = 41")
            snap = await parent.snapshot()
            assert (snap.calls, snap.last_record_sha256) == (1, first.record.record_sha256)
            async with await c.open_snapshot(snap) as restored:
                r = await restored.cell("print(x + 1)")
                assert r.stdout == b"42\n"
                check_link(r, restored, 2, first.record.record_sha256)  # type: ignore[arg-type]
            snap2, copies = await parent.fork(2)
            assert snap2.calls == 1
            randoms = set()
            for cp in copies:
                async with cp:
                    r = await cp.cell(PROBE)
                    x, random = probed(r)
                    assert x == "42"
                    randoms.add(random)
                    check_link(r, cp, 2, first.record.record_sha256)  # type: ignore[arg-type]
            assert len(randoms) == 2
            assert [s.snapshot_id for s in await c.list_snapshots()] == [
                snap.snapshot_id,
                snap2.snapshot_id,
            ]
            for s in (snap, snap2):
                assert (await c.delete_snapshot(s)).snapshot_id == s.snapshot_id
            with pytest.raises(plimsoll.NotDispatched) as e:
                await c.delete_snapshot(snap)
            assert e.value.code == "snapshot_not_found"
        assert len(await c.list_sessions()) == 0


# --- through proxies --------------------------------------------------------------------


@pytest.mark.parametrize(
    "member, value, field",
    [
        ("parent_session_id", "ses_0123456789abcdef_" + "ab" * 16, "origin.parent_session_id"),
        ("snapshot_sha256", "5" * 64, "origin.snapshot_sha256"),
        ("parent_calls", 0, "origin.parent_calls"),
        ("start", "restored", "origin.start"),
    ],
)
def test_a_fork_whose_copy_hangs_elsewhere_is_refused_and_its_copies_closed(
    snapshots: Daemon, member: str, value: Any, field: str
) -> None:
    def elsewhere(path: str, v: Any) -> None:
        if path.endswith("/fork") and "sessions" in v:
            v["sessions"][1]["origin"][member] = value

    with Proxy(snapshots.url, snapshot_response=elsewhere) as proxy:
        with client(snapshots, proxy.url) as c, c.open_session("python", provider="runsc") as s:
            s.cell("x = 41")
            with pytest.raises(plimsoll.ChainMismatch) as e:
                s.fork(2)
            assert e.value.field == field and not_dispatched_reason(e.value) is None
            assert e.value.close_error is None
            # The copies were closed again; the session goes on, its chain untouched.
            with client(snapshots) as direct:
                assert [x.session_id for x in direct.list_sessions()] == [s.id]
                for snap in direct.list_snapshots():
                    direct.delete_snapshot(snap)
            assert s.in_doubt is None and s.cell("print(x + 1)").stdout == b"42\n"


def test_a_snapshot_taken_elsewhere_in_the_chain_is_refused(snapshots: Daemon) -> None:
    def earlier(path: str, v: Any) -> None:
        if path.endswith("/snapshot"):
            v["calls"] = 0
            v.pop("last_record_sha256")

    with Proxy(snapshots.url, snapshot_response=earlier) as proxy:
        with client(snapshots, proxy.url) as c, c.open_session("python", provider="runsc") as s:
            s.cell("x = 41")
            with pytest.raises(plimsoll.ChainMismatch) as e:
                s.snapshot()
            assert (e.value.field, e.value.expected, e.value.got) == ("snapshot.calls", "1", "0")
            with client(snapshots) as direct:
                for snap in direct.list_snapshots():
                    direct.delete_snapshot(snap)


def test_a_restored_sessions_record_must_carry_its_origin(snapshots: Daemon) -> None:
    mode: dict[str, Optional[str]] = {"alter": None}

    def alter(path: str, v: Any) -> None:
        if not path.endswith("/cells") or "record" not in v or mode["alter"] is None:
            return
        link = v["record"]["session"]
        if mode["alter"] == "dropped":
            del link["origin"]
        else:
            link["origin"]["parent_calls"] += 1
        if mode["alter"] != "left":
            # Dressed: the record's digest recomputed over the altered origin, so every
            # digest holds; only the session's origin gives it away.
            v["record"]["record_sha256"] = plimsoll.record_sha256(v["record"])

    with Proxy(snapshots.url, session_response=alter) as proxy:
        with client(snapshots, proxy.url) as c, c.open_session("python", provider="runsc") as s:
            s.cell("x = 41")
            snap = s.snapshot()
            with c.open_snapshot(snap) as restored:
                for how, error in (
                    ("left", plimsoll.DigestMismatch),
                    ("changed", plimsoll.ChainMismatch),
                    ("dropped", plimsoll.ChainMismatch),
                ):
                    mode["alter"] = how
                    with pytest.raises(error) as e:
                        restored.cell("print(x + 1)")
                    if isinstance(e.value, plimsoll.DigestMismatch):
                        assert e.value.kind == "record"
                    else:
                        assert e.value.field == "origin"
                    assert not_dispatched_reason(e.value) is None
                    assert restored.in_doubt == e.value.request_id
                    restored.resync()
                mode["alter"] = None
                r = restored.cell("print(x + 1)")
                assert r.stdout == b"42\n"
                assert r.record.session is not None and r.record.session.sequence == 5
            c.delete_snapshot(snap)


def test_a_copys_answer_replayed_into_its_parents_chain_is_caught(snapshots: Daemon) -> None:
    """A copy's record carries its origin: its answer passed off as the parent's call (ids
    rewritten, the record's digest recomputed) fails the parent's chain on the origin."""
    kept: list[Any] = []
    replay = {"on": False}

    def swap(path: str, v: Any) -> Optional[Any]:
        if not path.endswith("/cells") or "record" not in v:
            return None
        if not replay["on"]:
            kept.append(copy.deepcopy(v))
            return None
        other = copy.deepcopy(kept[-1])
        other["request_id"] = other["record"]["request_id"] = v["request_id"]
        other["record"]["session"]["session_id"] = v["record"]["session"]["session_id"]
        other["record"]["record_sha256"] = plimsoll.record_sha256(other["record"])
        return other

    with Proxy(snapshots.url, session_response=swap) as proxy:
        with client(snapshots, proxy.url) as c, c.open_session("python", provider="runsc") as s:
            s.cell("x = 41")
            _, (cp,) = s.fork(1)
            with cp:
                cp.cell("print(x + 1)")  # sequence 2 of the copy, as the parent's next
                replay["on"] = True
                with pytest.raises(plimsoll.ChainMismatch) as e:
                    s.cell("print(x + 1)")
                assert e.value.field == "origin" and e.value.got.startswith("forked")
            with client(snapshots) as direct:
                for snap in direct.list_snapshots():
                    direct.delete_snapshot(snap)


# --- across a daemon restart ------------------------------------------------------------


def test_a_session_outlives_a_daemon_restart(restartable: Daemon) -> None:
    """Two runsc sessions, each with a call before the daemon's SIGTERM; the same daemon
    started again restores both under their ids. One's next call is the first its client sees
    of the restore (the chain crosses it on the record's origin); the other is resynced first
    (the chain takes the restore from the daemon's show). Both go on with their state."""
    d = restartable
    with client(d) as c, contextlib.ExitStack() as opened:
        s = opened.enter_context(c.open_session("python", provider="runsc"))
        t = opened.enter_context(c.open_session("python", provider="runsc"))
        r1 = s.cell("x = 41")
        t1 = t.cell("y = 6")
        assert r1.exit_code == 0 and t1.exit_code == 0, (r1.stderr, t1.stderr)
        assert s.info.origin is None and t.info.origin is None

        assert d.restart() == 0, d.log_text()

        r2 = s.cell("print(x + 1)")
        assert r2.stdout == b"42\n", r2.stderr
        check_link(r2, s, 2, r1.record.record_sha256)
        o = r2.record.session.origin  # type: ignore[union-attr]
        assert o is not None and o.start is SessionStart.RESTORED
        assert (o.parent_session_id, o.parent_calls, o.parent_record_sha256) == (
            s.id,
            1,
            r1.record.record_sha256,
        )
        assert s.info.origin == o and s.in_doubt is None
        # The daemon shows the same origin; the chain goes on under it.
        assert c.session(s.id).info.origin == o
        r3 = s.cell("print(x)")
        assert r3.stdout == b"41\n"
        check_link(r3, s, 3, r2.record.record_sha256)

        shown = t.resync()
        to = shown.origin
        assert to is not None and to.start is SessionStart.RESTORED
        assert (to.parent_session_id, to.parent_calls, to.parent_record_sha256) == (
            t.id,
            1,
            t1.record.record_sha256,
        )
        t2 = t.cell("print(y * 7)")
        assert t2.stdout == b"42\n", t2.stderr
        check_link(t2, t, 2, t1.record.record_sha256)
