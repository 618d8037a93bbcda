"""Sessions (docs/sessions.md): one sandbox kept across calls, an interpreter whose state
survives from one cell to the next, shell steps and files in the same ``/work``; snapshots of
it, and new sessions restored or forked from one.

Every call's answer is verified as a run's is (echoed request id, the tier against the
session's floor, the three digests, the record against the response) and besides follows the
session's chain: its record names this session, the next sequence number and the previous
call's record digest, and the session's provider, tier, evidence and environment, and the
origin of a restored or forked session. A restored or forked session's chain goes on from its
parent's. A session that outlives a daemon restart (saved on SIGTERM, restored by the next
daemon under its own id) changes its origin, tier and evidence once, at the call after the
last one saved, and nowhere else. A refusal is believed only with the echoed request id.
Calls to one session are sent one at a time.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, TypeVar, Union

from . import _session, _verify
from ._http import FAILED, aread_capped, exchange_timeout, read_capped
from ._session import NDJSON, SESSION_FLOOR, Chain, PreparedFile, PreparedSnapshot
from ._types import (
    File,
    ForkAnswer,
    Output,
    OutputChunk,
    RunResponse,
    SessionInfo,
    SnapshotInfo,
    Snippet,
    Step,
)
from ._verify import EXCHANGE_SLACK_S, Prepared, new_request_id
from .errors import FileTruncated, NotDispatched, PlimsollError, TransportError

if TYPE_CHECKING:
    from .client import AsyncClient, Client

OnChunk = Callable[[OutputChunk], Any]
"""Called with each chunk of a streamed call's output as it arrives (a preview: the verified
response holds the whole output). For an :class:`AsyncSession` it may be a coroutine
function."""

S = TypeVar("S", bound="_SessionBase")
"""A sync or async session: what a fork's copies are made as."""


class _SessionBase:
    """What the sync and async sessions share: the session, its chain, and the requests."""

    def __init__(self, client: Any, info: SessionInfo, chain: Chain) -> None:
        self._client = client
        self._chain = chain
        self._closed: Optional[SessionInfo] = None
        self.last_response: Optional[RunResponse] = None
        """The verified response of the last call answered (for a signer or an audit log;
        a file's GET returns only the bytes)."""

    @property
    def id(self) -> str:
        """The session's id (``ses_...``)."""
        return self._chain.info.session_id

    @property
    def info(self) -> SessionInfo:
        """The session as it was opened (or last resynced), with ``calls`` and
        ``last_record_sha256`` where this client's chain stands, and, from a call after a
        daemon restart restored it, the ``origin``, ``isolation`` and ``evidence_sha256`` that
        call's record carries."""
        return self._chain.info

    @property
    def language(self) -> str:
        return self._chain.info.language

    @property
    def in_doubt(self) -> Optional[str]:
        """The request id of a call that may have run without an answer this client could
        verify: until :meth:`resync`, no further call is sent (``ChainInDoubt``)."""
        return self._chain.in_doubt

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.id!r}, {self.info.provider} "
            f"({self.info.isolation}), calls={self._chain.sequence})"
        )

    # The requests, built and checked before anything is sent.

    def _prepare(self, run: Any, timeout_ms: Optional[int]) -> Prepared:
        return _session.prepare_call(
            run, timeout_ms=timeout_ms, max_body_bytes=self._client.max_body_bytes
        )

    def _cell(self, code: str, timeout_ms: Optional[int]) -> Prepared:
        return self._prepare(Snippet(self.language, code), timeout_ms)

    def _steps(
        self,
        steps: Sequence[Union[Step, str]],
        files: Sequence[File],
        artifacts: Sequence[str],
        timeout_ms: Optional[int],
    ) -> Prepared:
        return self._prepare(_session.project(steps, files, artifacts), timeout_ms)

    def _url(self, tail: str = "") -> str:
        return _session.session_url(self._client.base_url, self.id, tail)

    def _cell_url(self, restart: bool) -> str:
        return self._url("/cells?restart=true" if restart else "/cells")

    def _call_args(self, prepared: Prepared, url: str, streamed: bool) -> dict[str, Any]:
        headers = {**self._client._auth(), "content-type": "application/json"}
        if streamed:
            headers["accept"] = NDJSON
        return dict(
            method="POST",
            url=url,
            content=prepared.body,
            headers=headers,
            timeout=exchange_timeout(prepared.budget_s),
        )

    def _file_args(self, method: str, pf: PreparedFile) -> dict[str, Any]:
        rid = pf.prepared.request_id
        return dict(
            method=method,
            url=_session.file_url(self._client.base_url, self.id, pf.path),
            content=pf.content,
            headers={**self._client._auth(), **_session.file_headers(rid)},
            timeout=exchange_timeout(pf.prepared.budget_s),
        )

    def _close_args(self, request_id: str) -> dict[str, Any]:
        return dict(
            method="DELETE",
            url=self._url(),
            headers={**self._client._auth(), _session.REQUEST_ID_HEADER: request_id},
            timeout=exchange_timeout(EXCHANGE_SLACK_S),
        )

    def _snapshot_args(self, p: PreparedSnapshot) -> dict[str, Any]:
        """``POST .../snapshot``, or ``.../fork`` for a fork's request."""
        return dict(
            method="POST",
            url=self._url("/snapshot" if p.count is None else "/fork"),
            content=p.body,
            headers={**self._client._auth(), "content-type": "application/json"},
            timeout=exchange_timeout(EXCHANGE_SLACK_S),
        )

    def _snapshot_taken(self, p: PreparedSnapshot, status: int, body: bytes) -> SnapshotInfo:
        return _session.read_snapshot(p, self._chain, status, body)

    def _forked(
        self,
        p: PreparedSnapshot,
        status: int,
        body: bytes,
        make: "Callable[[SessionInfo, Chain], S]",
    ) -> "tuple[ForkAnswer, list[S], Optional[PlimsollError]]":
        """The fork's answer read, its copies made (to be handed out, or closed when the
        answer fails its checks), and what is wrong with it. A copy's chain goes on from this
        session's, and holds its calls to the image this session's open named."""
        answer = _session.read_fork(p, status, body)
        copies = [
            make(info, _session.copy_chain(info, self._chain.image)) for info in answer.sessions
        ]
        return answer, copies, _session.check_fork(p, self._chain, answer)

    def _show_args(self) -> dict[str, Any]:
        return dict(
            method="GET",
            url=self._url(),
            headers=self._client._auth(),
            timeout=exchange_timeout(EXCHANGE_SLACK_S),
        )

    # What the answers come to.

    def _whole(self, prepared: Prepared, status: int, body: bytes) -> RunResponse:
        return _verify.verify_answer(
            prepared,
            status,
            body,
            self.info.minimum_isolation,
            default_floor_name=SESSION_FLOOR,
        )

    def _line(self, prepared: Prepared, line: bytes) -> Union[OutputChunk, RunResponse]:
        return _session.read_line(prepared, line, self.info.minimum_isolation)

    def _ended_early(self, prepared: Prepared, url: str) -> TransportError:
        return TransportError(
            url, "the stream ended before its answer", request_id=prepared.request_id
        )

    def _answered(self, prepared: Prepared, response: RunResponse) -> RunResponse:
        response = self._chain.follow(prepared, response)
        self.last_response = response
        return response

    def _file_bytes(self, pf: PreparedFile, response: RunResponse) -> Optional[Output]:
        art = _session.got_file(pf, response)
        if not art.found:
            return None
        if art.truncated:
            raise FileTruncated(
                path=pf.path, size=art.size, kept=len(art.content), response=response
            )
        return art.content

    def _closed_info(self, request_id: str, status: int, body: bytes) -> SessionInfo:
        info = _session.read_closed(request_id, self.id, status, body)
        self._closed = info
        self._chain.info = info
        return info

    def _shown(self, status: int, body: bytes) -> SessionInfo:
        return _session.read_shown(self._url(), self.id, status, body)

    def _show_failed(self, e: BaseException) -> PlimsollError:
        return self._client._sessions_failed(self._url(), e, self.id)


_GONE = ("session_ended", "session_not_found")


class Session(_SessionBase):
    """An open session of this client's caller, from :meth:`Client.open_session`,
    :meth:`Client.session`, :meth:`Client.open_snapshot` or :meth:`Session.fork`. Safe to
    share between threads (calls are sent one at a time, in order); use it as a context
    manager to close it when done."""

    _client: "Client"

    def __init__(self, client: "Client", info: SessionInfo, chain: Chain) -> None:
        super().__init__(client, info, chain)
        self._lock = threading.Lock()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._closed is not None:
            return
        try:
            self.close()
        except NotDispatched as e:
            if e.code not in _GONE and exc_type is None:
                raise
        except PlimsollError:
            if exc_type is None:
                raise

    def cell(
        self,
        code: str,
        restart: bool = False,
        timeout_ms: Optional[int] = None,
        on_chunk: Optional[OnChunk] = None,
    ) -> RunResponse:
        """Runs ``code`` in the session's interpreter, whose state the previous cells left
        (``restart``: in a fresh one). ``result.state_kept`` says whether the state survives
        it, ``result.interpreter_end`` why it did not. With ``on_chunk``, the output is
        streamed to it as it is written; the verified response is returned either way."""
        prepared = self._cell(code, timeout_ms)
        return self._call(prepared, self._cell_url(restart), on_chunk)

    def steps(
        self,
        steps: Sequence[Union[Step, str]],
        *,
        files: Sequence[File] = (),
        artifacts: Sequence[str] = (),
        timeout_ms: Optional[int] = None,
        on_chunk: Optional[OnChunk] = None,
    ) -> RunResponse:
        """Writes ``files`` into the session's ``/work``, runs shell ``steps`` there in order
        (the first that fails stops them), returns ``artifacts``."""
        prepared = self._steps(steps, files, artifacts, timeout_ms)
        return self._call(prepared, self._url("/steps"), on_chunk)

    def put(self, path: str, content: bytes) -> RunResponse:
        """Writes ``content`` to ``/work/{path}`` in the session, bytes exact."""
        pf = _session.prepare_put(path, content, self._client.max_body_bytes)
        return self._file(pf, "PUT")

    def get(self, path: str) -> Optional[Output]:
        """The bytes of ``/work/{path}`` in the session, exactly; ``None`` when there is no
        such file (the verified call is :attr:`last_response`)."""
        pf = _session.prepare_get(path)
        return self._file_bytes(pf, self._file(pf, "GET"))

    def refresh(self) -> SessionInfo:
        """The session as the daemon shows it now (its calls, whether its interpreter is
        alive, its expiry). :attr:`info` and this client's chain stay where its own calls
        left them."""
        return self._show()

    def resync(self) -> SessionInfo:
        """Takes the daemon's word for where the session's chain stands, after a call that
        may have run without a verified answer put it in doubt. Its provider, environment and
        image must be the session's; its origin, tier and evidence too, unless a daemon
        restart restored the session under its own id right after the last call this client
        saw (:class:`SessionsError` otherwise: :meth:`Client.session` takes the daemon's word
        for all of it)."""
        with self._lock:
            info = self._show()
            self._chain.resync(info)
            return info

    def snapshot(self) -> SnapshotInfo:
        """Takes a snapshot of the session where its chain stands (the session is paused
        while its sandbox is saved, then goes on): :meth:`Client.open_snapshot` opens a new
        session from it. Checked: the echoed request id, and that it is of this session, in
        its sandbox, taken after the last call this client saw. Not sent while the chain is in
        doubt (:class:`ChainInDoubt`). The daemon refuses what cannot be saved honestly
        (``unsupported``: a provider other than runsc, a JavaScript session, a session holding
        a grant) and what is over the caller's quota (``capacity``)."""
        p = _session.prepare_snapshot()
        with self._lock:
            self._chain.check_sendable(p.request_id)
            args = self._snapshot_args(p)
            try:
                with self._client._http.stream(**args) as r:
                    status, body = r.status_code, read_capped(r.iter_bytes())
            except FAILED as e:
                raise self._client._failed(args["url"], p.request_id, e) from None
            return self._snapshot_taken(p, status, body)

    def fork(self, count: int) -> "tuple[SnapshotInfo, list[Session]]":
        """Forks the session into ``count`` new sessions: a snapshot taken where its chain
        stands (as :meth:`snapshot`; the session goes on), and each copy restored from it,
        with fresh randomness, its chain going on from this session's. Returns the snapshot
        (kept until it expires or is deleted) and the copies. Checked as a snapshot is, and
        each copy: a new session that says it was forked from this one at that snapshot, its
        chain starting there, in this session's provider, floor, language and image. Copies
        of an answer that fails are closed again (a failed close is the error's
        ``close_error``). ``count`` is at least 1 and at most the daemon's ``max_fork``."""
        p = _session.prepare_fork(count)
        with self._lock:
            self._chain.check_sendable(p.request_id)
            args = self._snapshot_args(p)
            try:
                with self._client._http.stream(**args) as r:
                    status, body = r.status_code, read_capped(r.iter_bytes())
            except FAILED as e:
                raise self._client._failed(args["url"], p.request_id, e) from None
            answer, copies, problem = self._forked(
                p, status, body, lambda info, chain: Session(self._client, info, chain)
            )
        if problem is not None:
            for copy in copies:
                try:
                    copy.close()
                except PlimsollError as e:
                    if problem.close_error is None:
                        problem.close_error = e
            raise problem
        return answer.snapshot, copies

    def close(self) -> SessionInfo:
        """Closes the session: its sandbox is removed; the answer says it ended ``closed``."""
        rid = new_request_id()
        with self._lock:
            args = self._close_args(rid)
            try:
                with self._client._http.stream(**args) as r:
                    status, body = r.status_code, read_capped(r.iter_bytes())
            except FAILED as e:
                raise self._client._failed(args["url"], rid, e) from None
            return self._closed_info(rid, status, body)

    def _show(self) -> SessionInfo:
        try:
            with self._client._http.stream(**self._show_args()) as r:
                status, body = r.status_code, read_capped(r.iter_bytes())
        except FAILED as e:
            raise self._show_failed(e) from None
        return self._shown(status, body)

    def _file(self, pf: PreparedFile, method: str) -> RunResponse:
        prepared = pf.prepared
        args = self._file_args(method, pf)
        with self._lock:
            self._chain.check_sendable(prepared.request_id)
            try:
                try:
                    with self._client._http.stream(**args) as r:
                        status, body = r.status_code, read_capped(r.iter_bytes())
                except FAILED as e:
                    raise self._client._failed(args["url"], prepared.request_id, e) from None
                return self._answered(prepared, self._whole(prepared, status, body))
            except NotDispatched:
                raise
            except BaseException:
                self._chain.doubt(prepared.request_id)
                raise

    def _call(self, prepared: Prepared, url: str, on_chunk: Optional[OnChunk]) -> RunResponse:
        args = self._call_args(prepared, url, on_chunk is not None)
        with self._lock:
            self._chain.check_sendable(prepared.request_id)
            try:
                try:
                    response = self._exchange(prepared, args, on_chunk)
                except FAILED as e:
                    raise self._client._failed(url, prepared.request_id, e) from None
                return self._answered(prepared, response)
            except NotDispatched:
                raise
            except BaseException:
                # It may have run: where the chain stands is unknown until resync().
                self._chain.doubt(prepared.request_id)
                raise

    def _exchange(
        self, prepared: Prepared, args: dict[str, Any], on_chunk: Optional[OnChunk]
    ) -> RunResponse:
        with self._client._http.stream(**args) as r:
            streamed = on_chunk is not None and _session.is_streamed(
                r.status_code, r.headers.get("content-type")
            )
            if not streamed:
                return self._whole(prepared, r.status_code, read_capped(r.iter_bytes()))
            assert on_chunk is not None
            lines = _session.Lines()
            for data in r.iter_bytes():
                for line in lines.feed(data):
                    item = self._line(prepared, line)
                    if isinstance(item, RunResponse):
                        return item
                    on_chunk(item)
            rest = lines.rest()
            if rest:
                item = self._line(prepared, rest)
                if isinstance(item, RunResponse):
                    return item
            raise self._ended_early(prepared, args["url"])


class AsyncSession(_SessionBase):
    """The :class:`Session` for asyncio, from :meth:`AsyncClient.open_session`,
    :meth:`AsyncClient.session`, :meth:`AsyncClient.open_snapshot` or
    :meth:`AsyncSession.fork`: the same checks, every call a coroutine. Use it with
    ``async with`` to close it when done."""

    _client: "AsyncClient"

    def __init__(self, client: "AsyncClient", info: SessionInfo, chain: Chain) -> None:
        super().__init__(client, info, chain)
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if self._closed is not None:
            return
        try:
            await self.close()
        except NotDispatched as e:
            if e.code not in _GONE and exc_type is None:
                raise
        except PlimsollError:
            if exc_type is None:
                raise

    async def cell(
        self,
        code: str,
        restart: bool = False,
        timeout_ms: Optional[int] = None,
        on_chunk: Optional[OnChunk] = None,
    ) -> RunResponse:
        """:meth:`Session.cell`; ``on_chunk`` may be a coroutine function."""
        prepared = self._cell(code, timeout_ms)
        return await self._call(prepared, self._cell_url(restart), on_chunk)

    async def steps(
        self,
        steps: Sequence[Union[Step, str]],
        *,
        files: Sequence[File] = (),
        artifacts: Sequence[str] = (),
        timeout_ms: Optional[int] = None,
        on_chunk: Optional[OnChunk] = None,
    ) -> RunResponse:
        """:meth:`Session.steps`."""
        prepared = self._steps(steps, files, artifacts, timeout_ms)
        return await self._call(prepared, self._url("/steps"), on_chunk)

    async def put(self, path: str, content: bytes) -> RunResponse:
        pf = _session.prepare_put(path, content, self._client.max_body_bytes)
        return await self._file(pf, "PUT")

    async def get(self, path: str) -> Optional[Output]:
        pf = _session.prepare_get(path)
        return self._file_bytes(pf, await self._file(pf, "GET"))

    async def refresh(self) -> SessionInfo:
        return await self._show()

    async def resync(self) -> SessionInfo:
        async with self._lock:
            info = await self._show()
            self._chain.resync(info)
            return info

    async def snapshot(self) -> SnapshotInfo:
        """:meth:`Session.snapshot`."""
        p = _session.prepare_snapshot()
        async with self._lock:
            self._chain.check_sendable(p.request_id)
            args = self._snapshot_args(p)
            try:
                async with self._client._http.stream(**args) as r:
                    status, body = r.status_code, await aread_capped(r.aiter_bytes())
            except FAILED as e:
                raise self._client._failed(args["url"], p.request_id, e) from None
            return self._snapshot_taken(p, status, body)

    async def fork(self, count: int) -> "tuple[SnapshotInfo, list[AsyncSession]]":
        """:meth:`Session.fork`: the copies are :class:`AsyncSession` objects."""
        p = _session.prepare_fork(count)
        async with self._lock:
            self._chain.check_sendable(p.request_id)
            args = self._snapshot_args(p)
            try:
                async with self._client._http.stream(**args) as r:
                    status, body = r.status_code, await aread_capped(r.aiter_bytes())
            except FAILED as e:
                raise self._client._failed(args["url"], p.request_id, e) from None
            answer, copies, problem = self._forked(
                p, status, body, lambda info, chain: AsyncSession(self._client, info, chain)
            )
        if problem is not None:
            for copy in copies:
                try:
                    await copy.close()
                except PlimsollError as e:
                    if problem.close_error is None:
                        problem.close_error = e
            raise problem
        return answer.snapshot, copies

    async def close(self) -> SessionInfo:
        rid = new_request_id()
        async with self._lock:
            args = self._close_args(rid)
            try:
                async with self._client._http.stream(**args) as r:
                    status, body = r.status_code, await aread_capped(r.aiter_bytes())
            except FAILED as e:
                raise self._client._failed(args["url"], rid, e) from None
            return self._closed_info(rid, status, body)

    async def _show(self) -> SessionInfo:
        try:
            async with self._client._http.stream(**self._show_args()) as r:
                status, body = r.status_code, await aread_capped(r.aiter_bytes())
        except FAILED as e:
            raise self._show_failed(e) from None
        return self._shown(status, body)

    async def _file(self, pf: PreparedFile, method: str) -> RunResponse:
        prepared = pf.prepared
        args = self._file_args(method, pf)
        async with self._lock:
            self._chain.check_sendable(prepared.request_id)
            try:
                try:
                    async with self._client._http.stream(**args) as r:
                        status, body = r.status_code, await aread_capped(r.aiter_bytes())
                except FAILED as e:
                    raise self._client._failed(args["url"], prepared.request_id, e) from None
                return self._answered(prepared, self._whole(prepared, status, body))
            except NotDispatched:
                raise
            except BaseException:
                self._chain.doubt(prepared.request_id)
                raise

    async def _call(
        self, prepared: Prepared, url: str, on_chunk: Optional[OnChunk]
    ) -> RunResponse:
        args = self._call_args(prepared, url, on_chunk is not None)
        async with self._lock:
            self._chain.check_sendable(prepared.request_id)
            try:
                try:
                    response = await self._exchange(prepared, args, on_chunk)
                except FAILED as e:
                    raise self._client._failed(url, prepared.request_id, e) from None
                return self._answered(prepared, response)
            except NotDispatched:
                raise
            except BaseException:
                self._chain.doubt(prepared.request_id)
                raise

    async def _exchange(
        self, prepared: Prepared, args: dict[str, Any], on_chunk: Optional[OnChunk]
    ) -> RunResponse:
        async with self._client._http.stream(**args) as r:
            streamed = on_chunk is not None and _session.is_streamed(
                r.status_code, r.headers.get("content-type")
            )
            if not streamed:
                body = await aread_capped(r.aiter_bytes())
                return self._whole(prepared, r.status_code, body)
            assert on_chunk is not None
            lines = _session.Lines()
            async for data in r.aiter_bytes():
                for line in lines.feed(data):
                    item = self._line(prepared, line)
                    if isinstance(item, RunResponse):
                        return item
                    await _deliver(on_chunk, item)
            rest = lines.rest()
            if rest:
                item = self._line(prepared, rest)
                if isinstance(item, RunResponse):
                    return item
            raise self._ended_early(prepared, args["url"])


async def _deliver(on_chunk: OnChunk, chunk: OutputChunk) -> None:
    out = on_chunk(chunk)
    if inspect.isawaitable(out):
        await out

