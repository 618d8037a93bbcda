"""The AsyncClient against the same real plimsolld: the same checks, as coroutines."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import plimsoll
from plimsoll import Reason, Tier, not_dispatched_reason

sys.path.insert(0, str(Path(__file__).parent))
from daemon import Daemon  # noqa: E402
from proxy import Proxy  # noqa: E402


@pytest.mark.asyncio
async def test_async_runs_verify_at_each_tier(
    daemon: Daemon, providers: plimsoll.ProvidersResponse, container: None
) -> None:
    async with plimsoll.AsyncClient(daemon.url, daemon.token) as c:
        process, contained = await asyncio.gather(
            c.run_python("print(6 * 7)", minimum_isolation="process", provider="process"),
            c.run_javascript("console.log(6 * 7)", minimum_isolation=Tier.CONTAINER),
        )
        assert process.stdout == b"42\n" and process.isolation is Tier.PROCESS
        assert contained.stdout == b"42\n" and contained.isolation is Tier.CONTAINER
        assert process.request_id != contained.request_id
        listed = await c.providers()
        assert listed.default_floor is Tier.CONTAINER
        assert [p.name for p in listed.providers] == [p.name for p in providers.providers]
        assert await c.default_floor() is Tier.CONTAINER and await c.is_ready()


@pytest.mark.asyncio
async def test_async_project_and_default_floor(daemon: Daemon, container: None) -> None:
    async with plimsoll.AsyncClient(daemon.url, daemon.token) as c:
        res = await c.run_project(
            ["cat in.bin > out.bin"],
            files=[plimsoll.File("in.bin", b"\x00\xff\xfe")],
            artifacts=["out.bin"],
        )
    assert res.isolation >= Tier.CONTAINER
    assert res.result.artifact("out.bin").content == b"\x00\xff\xfe"


@pytest.mark.asyncio
async def test_async_refusal_is_not_dispatched(daemon: Daemon) -> None:
    async with plimsoll.AsyncClient(daemon.url, daemon.token) as c:
        with pytest.raises(plimsoll.NotDispatched) as e:
            await c.run_python("print(1)", minimum_isolation="vm")
    assert not_dispatched_reason(e.value) is Reason.ISOLATION


@pytest.mark.asyncio
async def test_async_swapped_answers_read_may_have_run(daemon: Daemon) -> None:
    with Proxy(daemon.url, swap=True) as proxy:
        async with plimsoll.AsyncClient(proxy.url, daemon.token) as c:
            ran, refused = await asyncio.gather(
                c.run_javascript("console.log('ran')", minimum_isolation="process"),
                c.run_javascript("console.log('refused')", minimum_isolation="vm"),
                return_exceptions=True,
            )
    assert isinstance(ran, plimsoll.UnverifiedRefusal), repr(ran)
    assert not_dispatched_reason(ran) is None
    assert isinstance(refused, plimsoll.RequestIdMismatch), repr(refused)


@pytest.mark.asyncio
async def test_async_altered_answer_and_oversize_request(daemon: Daemon) -> None:
    def bump(v: dict) -> None:
        v["result"]["stdout"] = "43\n"

    with Proxy(daemon.url, response=bump) as proxy:
        async with plimsoll.AsyncClient(proxy.url, daemon.token, max_body_bytes=4096) as c:
            with pytest.raises(plimsoll.DigestMismatch) as e:
                await c.run_javascript("console.log(42)", minimum_isolation="process")
            assert e.value.kind == "result"
            seen = proxy.runs_seen
            with pytest.raises(plimsoll.RequestTooLarge):
                await c.run_javascript("//" + "x" * 5000, minimum_isolation="process")
            assert proxy.runs_seen == seen


@pytest.mark.asyncio
async def test_async_unreachable_and_invalid_are_not_dispatched() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    async with plimsoll.AsyncClient(f"http://127.0.0.1:{port}", "t") as c:
        with pytest.raises(plimsoll.Unreachable) as e:
            await c.run_python("print(1)", minimum_isolation="process")
        assert not_dispatched_reason(e.value) is Reason.ENVIRONMENT
        with pytest.raises(plimsoll.NotDispatched) as e2:
            await c.run_python("print(1)")  # the default floor cannot be read either
        assert e2.value.reason is Reason.ENVIRONMENT
        with pytest.raises(plimsoll.InvalidRequest):
            await c.run_project([], minimum_isolation="container")
        assert not await c.is_ready()
