"""Sessions (docs/sessions.md) against a real plimsolld at crun, sync and async: state kept
across cells, steps and files sharing /work, bytes exact both ways, output streamed before a
cell ends, every end and refusal explicit, another caller's session unseen; and proxies that
alter or replay a call's answer, caught every time."""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

import plimsoll
from plimsoll import EndReason, OutputChunk, Reason, Tier, not_dispatched_reason
from plimsoll._session import Chain

sys.path.insert(0, str(Path(__file__).parent))
from daemon import Daemon, add_caller  # noqa: E402
from proxy import Proxy  # noqa: E402

# Bytes that are not UTF-8, with NUL and a newline.
BLOB = bytes(range(256)) + b"\xff\xfe\x00\n"


def client(d: Daemon, url: Optional[str] = None) -> plimsoll.Client:
    return plimsoll.Client(url or d.url, d.token)


def check_chain(responses: list[plimsoll.RunResponse], session_id: str) -> None:
    """Each record follows the one before: what the client already checked, seen from here."""
    previous = None
    for n, r in enumerate(responses, start=1):
        link = r.record.session
        assert link is not None and link.session_id == session_id
        assert (link.sequence, link.previous_record_sha256) == (n, previous)
        assert r.record.record_sha256 == plimsoll.record_sha256(_record_wire(r))
        previous = r.record.record_sha256


def _record_wire(r: plimsoll.RunResponse) -> Any:
    return json.loads(r.body)["record"]


def test_a_session_keeps_state_and_shares_work_with_steps_and_files(sessions: Daemon) -> None:
    with client(sessions) as c, c.open_session("python", minimum_isolation="container") as s:
        info = s.info
        assert (info.provider, info.isolation, info.minimum_isolation) == (
            "crun",
            Tier.CONTAINER,
            Tier.CONTAINER,
        )
        assert info.session_id == s.id and info.language == "python"
        assert (info.calls, info.last_record_sha256, info.end_reason) == (0, None, None)
        assert info.interpreter_alive and info.environment.startswith("sha256:")
        assert info.wall.root_read_only and info.wall.uid != 0
        calls = []

        r = s.cell("n = 41\ndef twice(x):\n    return 2 * x")
        calls.append(r)
        assert (r.exit_code, r.result.state_kept, r.result.interpreter_end) == (0, True, None)
        r = s.cell("n += 1\nprint(n, twice(n))")
        calls.append(r)
        assert r.stdout == b"42 84\n" and r.result.state_kept is True, r.stderr
        # Every call carries the wall read before it, the session's provider and tier.
        assert r.result.wall is not None and r.result.wall == info.wall
        assert (r.provider, r.isolation) == ("crun", Tier.CONTAINER)
        assert r.record.minimum_isolation is Tier.CONTAINER

        # A step writes a file; a cell reads it; the interpreter says nothing of steps.
        r = s.steps(["printf 'a step wrote this' > /work/from-step", "ls /work"])
        calls.append(r)
        assert r.exit_code == 0 and b"from-step" in r.stdout, r.stderr
        assert r.result.state_kept is None and len(r.result.steps) == 2
        r = s.cell("print(repr(open('/work/from-step').read()), n)")
        calls.append(r)
        assert r.stdout == b"'a step wrote this' 42\n", r.stderr

        # Files, bytes exact both ways, and a file a cell wrote read back.
        calls.append(s.put("data/blob.bin", BLOB))
        assert s.get("data/blob.bin") == BLOB
        calls.append(s.last_response)
        r = s.cell(
            "b = open('/work/data/blob.bin', 'rb').read()\n"
            "print(len(b), b[-4:] == b'\\xff\\xfe\\x00\\n')\n"
            "open('/work/out.bin', 'wb').write(b[::-1])"
        )
        calls.append(r)
        assert r.stdout == b"260 True\n", r.stderr
        assert s.get("out.bin") == BLOB[::-1]
        calls.append(s.last_response)
        assert s.get("no/such/file") is None
        calls.append(s.last_response)
        # Steps with files and artifacts in one call.
        r = s.steps(
            ["cp in.txt copy.txt"],
            files=[plimsoll.File("in.txt", b"\x00\x01")],
            artifacts=["copy.txt", "from-step"],
        )
        calls.append(r)
        assert r.result.artifact("copy.txt").content == b"\x00\x01"
        assert r.result.artifact("from-step").content == b"a step wrote this"

        check_chain([x for x in calls if x is not None], s.id)
        assert s.info.calls == len(calls) == 10
        assert s.info.last_record_sha256 == calls[-1].record.record_sha256
        shown = s.refresh()
        assert (shown.calls, shown.last_record_sha256) == (10, s.info.last_record_sha256)
        assert shown.interpreter_alive and shown.request_id is None
        listed = c.list_sessions()
        assert s.id in [x.session_id for x in listed] and listed.get(s.id) == shown

        # Resumed by id (as another process would): the chain goes on from the daemon's word.
        resumed = c.session(s.id)
        assert (resumed.info.calls, resumed.info.last_record_sha256) == (10, calls[-1].record.record_sha256)
        r = resumed.cell("print(n)")
        assert r.stdout == b"42\n"
        link = r.record.session
        assert link is not None and (link.sequence, link.previous_record_sha256) == (
            11,
            calls[-1].record.record_sha256,
        )
    # Closed by the context manager.
    with client(sessions) as c:
        assert s.id not in [x.session_id for x in c.list_sessions()]


def test_a_javascript_session_keeps_its_state(sessions: Daemon) -> None:
    with client(sessions) as c, c.open_session("javascript") as s:
        # No floor sent: the daemon's default floor (container), learnt from its listing.
        assert s.info.minimum_isolation is Tier.CONTAINER and s.language == "javascript"
        assert s.cell("var n = 20; function twice(x) { return 2 * x }").exit_code == 0
        r = s.cell("n += 1; console.log(twice(n))")
        assert r.stdout == b"42\n" and r.result.state_kept is True, r.stderr


def test_streaming_delivers_output_before_the_cell_ends(sessions: Daemon) -> None:
    with client(sessions) as c, c.open_session("python") as s:
        seen: list[tuple[float, OutputChunk]] = []
        r = s.cell(
            "import sys, time\nprint('first', flush=True)\ntime.sleep(1.5)\n"
            "print('second')\nprint('err', file=sys.stderr)",
            on_chunk=lambda chunk: seen.append((time.monotonic(), chunk)),
        )
        final_at = time.monotonic()
        assert seen, "no chunk was streamed"
        first_at, first = seen[0]
        assert (first.stream, first.offset, first.bytes) == (
            plimsoll.OutputStream.STDOUT,
            0,
            b"first\n",
        )
        assert final_at - first_at >= 1.0, "the first chunk came only with the end of the cell"
        # The final line is verified as a whole answer, and holds the whole output.
        assert r.stdout == b"first\nsecond\n" and r.stderr == b"err\n"
        for stream, whole in ((plimsoll.OutputStream.STDOUT, r.stdout), (plimsoll.OutputStream.STDERR, r.stderr)):
            parts = [ch for _, ch in seen if ch.stream is stream]
            assert b"".join(ch.bytes for ch in parts) == whole
            assert [ch.offset for ch in parts] == [
                sum(len(p.bytes) for p in parts[:i]) for i in range(len(parts))
            ]
        assert plimsoll.result_sha256(json.loads(r.body)["result"]) == r.result_sha256
        # Steps stream too, across their steps; the chain goes on through streamed calls.
        chunks: list[OutputChunk] = []
        r2 = s.steps(["echo one", "echo two >&2", "echo three"], on_chunk=chunks.append)
        assert r2.exit_code == 0 and r2.stdout == b"three\n"  # the last step's, as in a run
        assert [st.stdout for st in r2.result.steps] == [b"one\n", b"", b"three\n"]
        out = [ch for ch in chunks if ch.stream is plimsoll.OutputStream.STDOUT]
        assert b"".join(ch.bytes for ch in out) == b"one\nthree\n"
        assert out[-1].offset == 4  # offsets count across the call's steps
        r3 = s.cell("print('after')")
        check_chain([r, r2, r3], s.id)


def test_an_interpreter_that_ends_is_restarted_only_when_asked(sessions: Daemon) -> None:
    with client(sessions) as c, c.open_session("python") as s:
        s.cell("kept = 1")
        r = s.cell("import os\nprint('bye', flush=True)\nos._exit(3)")
        assert r.result.state_kept is False
        assert r.result.interpreter_end is EndReason.INTERPRETER_CRASH
        assert r.result.interpreter_end.ends_interpreter_only and r.stdout == b"bye\n"
        assert not s.refresh().interpreter_alive
        with pytest.raises(plimsoll.NotDispatched) as e:
            s.cell("print(kept)")
        assert (e.value.code, e.value.reason, e.value.status) == ("interpreter_ended", Reason.REQUEST, 409)
        # Nothing ran: the chain did not move, and the next call follows the last that ran.
        assert s.info.calls == 2 and s.in_doubt is None
        r = s.cell("print('kept' in dir())", restart=True)
        assert r.stdout == b"False\n" and r.result.state_kept is False
        r = s.cell("x = 1\nprint(x)")
        assert r.result.state_kept is True and r.record.session.sequence == 4  # type: ignore[union-attr]
        # A cell past its timeout: its interpreter is killed, and says so.
        r = s.cell("import time\ntime.sleep(30)", timeout_ms=1000)
        assert r.result.timed_out and r.result.state_kept is False
        assert r.result.interpreter_end is EndReason.CELL_TIMEOUT


def test_a_closed_session_refuses_every_call_with_its_end_reason(sessions: Daemon) -> None:
    with client(sessions) as c:
        s = c.open_session("python")
        s.cell("print(1)")
        closed = s.close()
        assert closed.end_reason is EndReason.CLOSED and closed.session_id == s.id
        assert closed.request_id is not None and s.info.end_reason is EndReason.CLOSED
        calls = [
            lambda: s.cell("print(2)"),
            lambda: s.cell("print(2)", on_chunk=lambda ch: None),  # the error as a stream line
            lambda: s.steps(["true"]),
            lambda: s.put("x", b"x"),
            lambda: s.get("x"),
            s.close,
        ]
        for call in calls:
            with pytest.raises(plimsoll.NotDispatched) as e:
                call()
            assert (e.value.code, e.value.end_reason) == ("session_ended", EndReason.CLOSED)
            assert not_dispatched_reason(e.value) is Reason.REQUEST
            assert "closed" in str(e.value)
        with pytest.raises(plimsoll.SessionsError) as shown:
            c.session(s.id)
        assert (shown.value.code, shown.value.end_reason, shown.value.status) == (
            "session_ended",
            EndReason.CLOSED,
            410,
        )
        with s:  # already closed: leaving the block does nothing
            pass


def test_another_callers_session_is_not_found(sessions: Daemon) -> None:
    other_token = add_caller(sessions.dir / "callers.toml", "pytest-other")
    with client(sessions) as c, plimsoll.Client(sessions.url, other_token) as other:
        with c.open_session("python") as mine:
            mine.cell("secret = 7")
            assert mine.id not in [x.session_id for x in other.list_sessions()]
            unknown = mine.id[:21] + "0" * 32
            for sid in (mine.id, unknown):
                with pytest.raises(plimsoll.SessionsError) as e:
                    other.session(sid)
                assert (e.value.code, e.value.status, e.value.end_reason) == (
                    "session_not_found",
                    404,
                    None,
                )
            # A caller that has the id anyway (here: made up from the id alone) is refused,
            # with its own request id echoed, exactly as for an unknown id.
            forged = plimsoll.Session(other, mine.info, Chain(mine.info, 0, None))
            for call in (lambda: forged.cell("print(secret)"), lambda: forged.get("x"), forged.close):
                with pytest.raises(plimsoll.NotDispatched) as nd:
                    call()
                assert (nd.value.code, nd.value.status) == ("session_not_found", 404)
                assert nd.value.reason is Reason.REQUEST
            # Mine is untouched.
            assert mine.cell("print(secret)").stdout == b"7\n"
        with pytest.raises(plimsoll.InvalidRequest):
            other.session("../../v1/runs")


def test_refusals_at_open_ran_nothing(sessions: Daemon) -> None:
    with client(sessions) as c:
        with pytest.raises(plimsoll.NotDispatched) as e:
            c.open_session("python", minimum_isolation="vm")
        assert e.value.reason is Reason.ISOLATION
        for bad in (
            dict(language="ruby"),
            dict(language="python", idle_timeout_ms=0),
            dict(language="python", limits=plimsoll.Limits(memory_bytes=0)),
            dict(language="python", provider=""),
        ):
            with pytest.raises(plimsoll.InvalidRequest):
                c.open_session(**bad)
        # Two sessions per caller here: the third is refused, capacity.
        with c.open_session("python") as a, c.open_session("python") as b:
            assert a.id != b.id
            with pytest.raises(plimsoll.NotDispatched) as full:
                c.open_session("python")
            assert full.value.reason is Reason.CAPACITY and full.value.status == 429
        assert c.list_sessions().sessions == []


# A cell reaching a host the egress grant `pkgs` does not list, by plain HTTP through
# HTTP_PROXY (which a session with an egress grant has): the broker refuses it (403) before
# resolving or connecting anything.
REACH_ELSEWHERE = (
    "import urllib.request\n"
    "try:\n"
    "    urllib.request.urlopen('http://elsewhere.plimsoll.test/simple/', timeout=20)\n"
    "except Exception as e:\n"
    "    print('refused', getattr(e, 'code', e))"
)


def test_a_session_holds_its_grant_for_its_whole_life(sessions: Daemon, api: Any) -> None:
    with client(sessions) as c:
        # An API grant: every cell may call the API through the broker; each result lists
        # the calls made since the call before.
        with c.open_session("javascript", minimum_isolation="container", grant="orders") as s:
            first = s.cell("host.get('/orders/7').then((o) => console.log(o.item))")
            assert first.stdout == b"tea\n", first.stderr
            [call] = first.result.calls
            assert (call.method, call.route, call.status, call.error) == ("GET", "/orders/*", 200, None)
            assert api.seen[-1] == {"path": "/orders/7", "authorization": f"Bearer {api.secret}"}
            second = s.cell("host.get('/orders/8').then((o) => console.log(o.order))")
            assert second.stdout == b"8\n", second.stderr
            assert [(x.route, x.status) for x in second.result.calls] == [("/orders/*", 200)]
            assert s.cell("console.log(1)").result.calls == []
            assert api.secret.encode() not in first.body + second.body
        # An egress grant: each result lists the connection attempts since the call before,
        # refused ones included, every member read strictly and inside the result digest.
        with c.open_session("python", minimum_isolation="container", grant="pkgs") as s:
            r = s.cell(REACH_ELSEWHERE)
            assert r.stdout == b"refused 403\n", r.stderr
            [receipt] = r.result.egress
            assert (
                receipt.host,
                receipt.port,
                receipt.kind,
                receipt.verdict,
                receipt.rule,
                receipt.address,
                receipt.sni,
                receipt.ended,
            ) == ("elsewhere.plimsoll.test", 80, "http", "refused", "host_not_allowed", None, None, None)
            assert (receipt.bytes_up, receipt.bytes_down) == (0, 0)
            assert receipt.start_ms <= receipt.end_ms
            assert json.loads(r.body)["result"]["egress"][0]["rule"] == "host_not_allowed"
            assert s.cell("print(1)").result.egress == []
        # A grant the caller may not use opens nothing, exactly as one that does not exist;
        # an empty name is refused here, unsent.
        with pytest.raises(plimsoll.NotDispatched) as e:
            c.open_session("python", minimum_isolation="container", grant="no-such-grant")
        assert e.value.reason is Reason.PERMISSION and e.value.status == 403
        with pytest.raises(plimsoll.InvalidRequest):
            c.open_session("python", grant="")
        assert c.list_sessions().sessions == []


@pytest.mark.asyncio
async def test_async_sessions(sessions: Daemon) -> None:
    async with plimsoll.AsyncClient(sessions.url, sessions.token) as c:
        async with await c.open_session("python", minimum_isolation=Tier.CONTAINER) as s:
            assert (await s.cell("n = 6")).result.state_kept is True
            got: list[OutputChunk] = []

            async def on_chunk(chunk: OutputChunk) -> None:
                got.append(chunk)

            r = await s.cell("print(n * 7)", on_chunk=on_chunk)
            assert r.stdout == b"42\n" and b"".join(ch.bytes for ch in got) == b"42\n"
            await s.put("b.bin", BLOB)
            assert await s.get("b.bin") == BLOB
            r = await s.steps(["wc -c < b.bin"], on_chunk=got.append)
            assert r.stdout.strip() == b"260"
            assert s.info.calls == 5
            assert [x.session_id for x in await c.list_sessions()] == [s.id]
            resumed = await c.session(s.id)
            assert (await resumed.cell("print(n)")).stdout == b"6\n"
        with pytest.raises(plimsoll.NotDispatched) as e:
            await s.cell("print(n)")
        assert (e.value.code, e.value.end_reason) == ("session_ended", EndReason.CLOSED)
        assert len(await c.list_sessions()) == 0


# --- through proxies --------------------------------------------------------------------


def test_a_proxy_that_alters_a_calls_answer_is_caught_and_the_chain_waits(
    sessions: Daemon,
) -> None:
    def bump(path: str, v: Any) -> None:
        if path.endswith("/cells") and "result" in v and v["result"]["stdout"] == "42\n":
            v["result"]["stdout"] = "43\n"

    with Proxy(sessions.url, session_response=bump) as proxy, client(sessions, proxy.url) as c:
        with c.open_session("python") as s:
            s.cell("n = 41")
            for stream in (None, lambda ch: None):
                with pytest.raises(plimsoll.DigestMismatch) as e:
                    s.cell("n += 1\nprint(n)", on_chunk=stream)
                assert e.value.kind == "result" and not_dispatched_reason(e.value) is None
                # The altered call ran: this client no longer knows where the chain stands,
                # and sends nothing more until told.
                assert s.in_doubt == e.value.request_id
                seen = proxy.session_calls_seen
                with pytest.raises(plimsoll.ChainInDoubt) as doubt:
                    s.cell("print(n)")
                assert not_dispatched_reason(doubt.value) is Reason.REQUEST
                assert proxy.session_calls_seen == seen, "a call was sent while in doubt"
                info = s.resync()
                assert s.in_doubt is None and info.calls == s.info.calls
                s.cell("n = 41")

            # A file's bytes altered on the way back.
            def flip(path: str, v: Any) -> None:
                if "/files/" in path and "result" in v and v["result"].get("artifacts"):
                    v["result"]["artifacts"][0]["content"] = {"base64": "AA=="}

            proxy.session_response = flip
            s.put("f.bin", b"\xff")
            with pytest.raises(plimsoll.DigestMismatch) as e:
                s.get("f.bin")
            assert e.value.kind == "result"


@pytest.mark.parametrize(
    "rewrite, error",
    [
        ({"isolation": "process"}, plimsoll.EvidenceMismatch),
        ({"isolation": "process", "minimum_isolation": "process"}, plimsoll.EvidenceMismatch),
        ({"minimum_isolation": "process"}, plimsoll.RecordMismatch),
        ({"provider": "runc"}, plimsoll.ProviderMismatch),
    ],
)
def test_a_session_opened_below_what_was_asked_is_refused_and_closed(
    sessions: Daemon, rewrite: dict, error: type
) -> None:
    with Proxy(sessions.url, open_response=lambda v: v.update(rewrite)) as proxy:
        with client(sessions, proxy.url) as c:
            with pytest.raises(error) as e:
                c.open_session("python", minimum_isolation="container", provider="crun")
    assert not_dispatched_reason(e.value) is None and e.value.close_error is None
    # The client closed the session it refused: none is left open.
    with client(sessions) as c:
        assert c.list_sessions().sessions == []


def test_a_proxy_that_replays_an_earlier_answer_is_caught(sessions: Daemon) -> None:
    answers: list[Any] = []
    mode = {"replay": None}

    def replay(path: str, v: Any) -> Optional[Any]:
        if not path.endswith("/cells") or "result" not in v:
            return None
        if mode["replay"] is None:
            answers.append(copy.deepcopy(v))
            return None
        old = copy.deepcopy(answers[0])
        if mode["replay"] == "as is":
            return old
        # The earlier answer dressed as this call's: its ids rewritten and the record's digest
        # recomputed, so every digest holds (the code and its output are the same); only its
        # place in the chain gives it away.
        old["request_id"] = old["record"]["request_id"] = v["request_id"]
        old["record"]["record_sha256"] = plimsoll.record_sha256(old["record"])
        return old

    with Proxy(sessions.url, session_response=replay) as proxy, client(sessions, proxy.url) as c:
        with c.open_session("python") as s:
            first = s.cell("print('same')")
            second = s.cell("print('same')")
            assert first.request_sha256 == second.request_sha256
            assert first.result_sha256 == second.result_sha256

            mode["replay"] = "as is"
            with pytest.raises(plimsoll.RequestIdMismatch) as e:
                s.cell("print('same')")
            assert e.value.echoed == first.request_id and not_dispatched_reason(e.value) is None
            s.resync()

            mode["replay"] = "dressed"
            for stream in (None, lambda ch: None):
                with pytest.raises(plimsoll.ChainMismatch) as chain:
                    s.cell("print('same')", on_chunk=stream)
                assert chain.value.field == "sequence" and chain.value.got == "1"
                assert int(chain.value.expected) > 1
                assert not_dispatched_reason(chain.value) is None
                assert "may have run" in str(chain.value)
                s.resync()
            mode["replay"] = None
            assert s.cell("print('same')").stdout == b"same\n"


def test_a_streamed_refusal_whose_echo_is_dropped_is_not_honoured(sessions: Daemon) -> None:
    def drop(path: str, v: Any) -> None:
        if "error" in v:
            v["request_id"] = None

    with client(sessions) as direct:
        s = direct.open_session("python")
        s.close()
    with Proxy(sessions.url, session_response=drop) as proxy, client(sessions, proxy.url) as c:
        for stream in (None, lambda ch: None):
            # The ended session, reached through the proxy (a session object of its own each
            # time: the one before is in doubt after the unverified refusal).
            through = plimsoll.Session(c, s.info, Chain(s.info, 0, None))
            with pytest.raises(plimsoll.UnverifiedRefusal) as e:
                through.cell("print(1)", on_chunk=stream)
            assert e.value.claimed_reason is Reason.REQUEST and e.value.echoed is None
            assert not_dispatched_reason(e.value) is None
            assert through.in_doubt == e.value.request_id


@pytest.mark.asyncio
async def test_asyncio_catches_a_replayed_answer(sessions: Daemon) -> None:
    answers: list[Any] = []

    def replay(path: str, v: Any) -> Optional[Any]:
        if not path.endswith("/cells") or "result" not in v:
            return None
        if not answers:
            answers.append(copy.deepcopy(v))
            return None
        old = copy.deepcopy(answers[0])
        old["request_id"] = old["record"]["request_id"] = v["request_id"]
        old["record"]["record_sha256"] = plimsoll.record_sha256(old["record"])
        return old

    with Proxy(sessions.url, session_response=replay) as proxy:
        async with plimsoll.AsyncClient(proxy.url, sessions.token) as c:
            async with await c.open_session("python") as s:
                await s.cell("print(1)")
                with pytest.raises(plimsoll.ChainMismatch) as e:
                    await s.cell("print(1)", on_chunk=lambda ch: None)
                assert e.value.field == "sequence"
                with pytest.raises(plimsoll.ChainInDoubt):
                    await s.cell("print(1)")
