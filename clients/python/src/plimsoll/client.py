"""The sync :class:`Client` and the :class:`AsyncClient` of plimsolld, on httpx.

Each run gets a fresh request id; its answer is verified (echoed id, tier against the floor,
named provider, the three digests, the record against the response) before it is returned.
Nothing is ever retried: an error either promises that nothing ran
(:class:`~plimsoll.errors.NotDispatched`) or says the code may have run
(:class:`~plimsoll.errors.MayHaveRun`). Sessions (:meth:`Client.open_session`) keep one
sandbox across calls, each verified the same way and checked against the session's chain
(:mod:`plimsoll.session`); a session's snapshot opens new sessions that go on from its chain
(:meth:`Client.open_snapshot`).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Union

import httpx

from . import _session, _trial, _verify
from ._session import Chain, PreparedOpen, PreparedRestore
from ._types import (
    File,
    Limits,
    Project,
    ProvidersResponse,
    RunResponse,
    RunSpec,
    SessionList,
    SnapshotInfo,
    SnapshotList,
    Snippet,
    Step,
    Tier,
    TierLike,
)
from ._http import (
    FAILED,
    NOT_SENT,
    __version__,
    aread_capped,
    describe,
    http_options,
    read_capped,
    exchange_timeout,
)
from ._verify import (
    CONNECT_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    EXCHANGE_SLACK_S,
    Prepared,
)
from .errors import (
    InvalidRequest,
    PlimsollError,
    ProvidersError,
    SessionsError,
    TransportError,
    Unreachable,
)
from .session import AsyncSession, Session


def _project(
    steps: Sequence[Union[Step, str]],
    files: Iterable[File],
    artifacts: Iterable[str],
) -> Project:
    return Project(steps=list(steps), files=list(files), artifacts=list(artifacts))


def _trial_project(
    simulator: str,
    controller: File,
    scenarios: Sequence[File],
    *,
    simulator_sha256: Optional[str],
    first_deadline_ms: Optional[int],
    tick_deadline_ms: Optional[int],
    reproducible: bool,
) -> Project:
    """:func:`plimsoll.trial_project`, its refusal an :class:`InvalidRequest` (nothing sent)."""
    try:
        return _trial.trial_project(
            simulator,
            controller,
            scenarios,
            simulator_sha256=simulator_sha256,
            first_deadline_ms=first_deadline_ms,
            tick_deadline_ms=tick_deadline_ms,
            reproducible=reproducible,
        )
    except ValueError as e:
        raise InvalidRequest(str(e)) from None


class _Base:
    # The httpx client class: httpx.Client or httpx.AsyncClient.
    _HTTP: Any

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        default_floor: Optional[TierLike] = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self.__token = _verify.validate_token(token)
        self._max_body_bytes = max_body_bytes
        # The daemon's default floor, read once from GET /v1/providers when a run sets no
        # floor (or given here by the caller, who then vouches for it).
        self._default_floor: Optional[Tier] = (
            Tier(default_floor) if default_floor is not None else None
        )
        self._http = self._HTTP(**http_options())

    @property
    def base_url(self) -> str:
        """The daemon's base URL."""
        return self._base_url

    @property
    def max_body_bytes(self) -> int:
        """The largest request body this client sends."""
        return self._max_body_bytes

    def __repr__(self) -> str:
        # The token never appears.
        return f"{type(self).__name__}({self._base_url!r})"

    def _auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.__token}"}

    def _prepare(self, run: RunSpec, **kw: Any) -> Prepared:
        return _verify.prepare(run, max_body_bytes=self._max_body_bytes, **kw)

    # The request building and the checking that Client and AsyncClient share: each of them
    # only sends (blocking or awaiting) what these build, and hands these what came back.

    def _runs_url(self) -> str:
        return f"{self._base_url}/v1/runs"

    def _providers_url(self) -> str:
        return f"{self._base_url}/v1/providers"

    def _readyz_url(self) -> str:
        return f"{self._base_url}/readyz"

    def _run_stream(self, prepared: Prepared) -> dict[str, Any]:
        """The arguments of ``stream`` for ``POST /v1/runs``."""
        return dict(
            method="POST",
            url=self._runs_url(),
            content=prepared.body,
            headers={**self._auth(), "content-type": "application/json"},
            timeout=exchange_timeout(prepared.budget_s),
        )

    def _providers_stream(self) -> dict[str, Any]:
        """The arguments of ``stream`` for ``GET /v1/providers``."""
        return dict(
            method="GET",
            url=self._providers_url(),
            headers=self._auth(),
            timeout=exchange_timeout(EXCHANGE_SLACK_S),
        )

    def _run_failed(self, prepared: Prepared, e: BaseException) -> PlimsollError:
        """The error for a run exchange that failed without an answer: nothing was sent, or
        the request may have left."""
        return self._failed(self._runs_url(), prepared.request_id, e)

    def _failed(self, url: str, request_id: str, e: BaseException) -> PlimsollError:
        """The error for an exchange (a run, a session's open or call) that failed without
        an answer: nothing was sent, or the request may have left."""
        if isinstance(e, NOT_SENT):
            return Unreachable(url, describe(e), request_id=request_id)
        return TransportError(url, describe(e), request_id=request_id)

    def _sessions_url(self) -> str:
        return f"{self._base_url}/v1/sessions"

    def _open_stream(self, p: PreparedOpen) -> dict[str, Any]:
        """The arguments of ``stream`` for ``POST /v1/sessions``."""
        return dict(
            method="POST",
            url=self._sessions_url(),
            content=p.body,
            headers={**self._auth(), "content-type": "application/json"},
            timeout=exchange_timeout(EXCHANGE_SLACK_S),
        )

    def _restore_stream(self, p: PreparedRestore) -> dict[str, Any]:
        """The arguments of ``stream`` for ``POST /v1/snapshots/{id}/sessions``."""
        return dict(
            method="POST",
            url=_session.snapshots_url(self._base_url, p.snapshot_id, "/sessions"),
            content=p.body,
            headers={**self._auth(), "content-type": "application/json"},
            timeout=exchange_timeout(EXCHANGE_SLACK_S),
        )

    def _delete_snapshot_stream(self, request_id: str, snapshot_id: str) -> dict[str, Any]:
        """The arguments of ``stream`` for ``DELETE /v1/snapshots/{id}``."""
        return dict(
            method="DELETE",
            url=_session.snapshots_url(self._base_url, snapshot_id),
            headers={**self._auth(), _session.REQUEST_ID_HEADER: request_id},
            timeout=exchange_timeout(EXCHANGE_SLACK_S),
        )

    def _get_stream(self, url: str) -> dict[str, Any]:
        return dict(
            method="GET", url=url, headers=self._auth(), timeout=exchange_timeout(EXCHANGE_SLACK_S)
        )

    def _sessions_failed(
        self, url: str, e: BaseException, session_id: Optional[str] = None
    ) -> SessionsError:
        return SessionsError(f"cannot read {url}: {describe(e)}", session_id=session_id)

    def _prepare_open(self, language: str, **options: Any) -> PreparedOpen:
        return _session.prepare_open(language, max_body_bytes=self._max_body_bytes, **options)

    def _providers_failed(self, e: BaseException) -> ProvidersError:
        return ProvidersError(f"cannot read {self._providers_url()}: {describe(e)}")

    def _read_providers(self, status: int, body: bytes) -> ProvidersResponse:
        """Checks the answer to ``GET /v1/providers`` and remembers the default floor."""
        providers = _verify.read_providers(status, body, self._providers_url())
        self._default_floor = providers.default_floor
        return providers


class Client(_Base):
    """A blocking client of one daemon. Safe to share between threads; close it (or use it as
    a context manager) when done.

    ``max_body_bytes``: the largest request body sent (default 8 MiB, the daemon's default
    ``max_body_bytes``); a larger request raises :class:`~plimsoll.errors.RequestTooLarge` and
    nothing is sent.
    """

    _HTTP = httpx.Client
    _http: httpx.Client

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- runs ---------------------------------------------------------------------------

    def run(
        self,
        run: RunSpec,
        *,
        minimum_isolation: Optional[TierLike] = None,
        provider: Optional[str] = None,
        limits: Optional[Limits] = None,
        grant: Optional[str] = None,
        image: Optional[str] = None,
    ) -> RunResponse:
        """Runs ``run`` (a :class:`Snippet` or a :class:`Project`) and returns the verified
        response. Blocks until the run is over. ``image``: the image to run in, a name or an
        identity (``sha256:...``); the record must say the code ran in it."""
        prepared = self._prepare(
            run,
            minimum_isolation=minimum_isolation,
            provider=provider,
            limits=limits,
            grant=grant,
            image=image,
        )
        default_floor = None
        if prepared.floor is None:
            try:
                default_floor = self.default_floor()
            except PlimsollError as e:
                raise _verify.floor_unknown(e, prepared.request_id) from None
        try:
            with self._http.stream(**self._run_stream(prepared)) as r:
                status, body = r.status_code, read_capped(r.iter_bytes())
        except FAILED as e:
            raise self._run_failed(prepared, e) from None
        return _verify.verify_answer(prepared, status, body, default_floor)

    def run_snippet(self, language: str, code: str, **options: Any) -> RunResponse:
        """Runs ``code`` in ``language`` (``javascript`` or ``python``)."""
        return self.run(Snippet(language, code), **options)

    def run_python(self, code: str, **options: Any) -> RunResponse:
        return self.run(Snippet("python", code), **options)

    def run_javascript(self, code: str, **options: Any) -> RunResponse:
        return self.run(Snippet("javascript", code), **options)

    def run_project(
        self,
        steps: Sequence[Union[Step, str]],
        *,
        files: Iterable[File] = (),
        artifacts: Iterable[str] = (),
        **options: Any,
    ) -> RunResponse:
        """Writes ``files`` under ``/work``, runs ``steps`` in order, returns ``artifacts``."""
        return self.run(_project(steps, files, artifacts), **options)

    def trial(
        self,
        simulator: str,
        controller: File,
        scenarios: Sequence[File],
        *,
        simulator_sha256: Optional[str] = None,
        first_deadline_ms: Optional[int] = None,
        tick_deadline_ms: Optional[int] = None,
        reproducible: bool = False,
        minimum_isolation: Optional[TierLike] = None,
        provider: Optional[str] = None,
        limits: Optional[Limits] = None,
        image: Optional[str] = None,
    ) -> RunResponse:
        """Examines ``controller`` (a :class:`File` named ``*.js`` or ``*.py``) against the
        simulator ``simulator`` of the image the run gets, on ``scenarios`` (each a
        :class:`File` holding a scenario's JSON; docs/simulators.md), as ``plimsoll trial``
        does: one project of one trial step (:func:`plimsoll.trial_project`). Returns the
        verified response: ``record.trials[0]`` is the verdict (the simulator's name, version
        and SHA-256, each trial's end, reason, ticks, score and fingerprint), and the
        trajectories are ``result.artifacts``, in the scenarios' order. A name the runner
        could not take, two files of one name or a controller of another language raise
        :class:`InvalidRequest` before anything is sent; a simulator the image does not
        declare is refused by the daemon (:class:`NotDispatched`, reason ``environment``)."""
        project = _trial_project(
            simulator,
            controller,
            scenarios,
            simulator_sha256=simulator_sha256,
            first_deadline_ms=first_deadline_ms,
            tick_deadline_ms=tick_deadline_ms,
            reproducible=reproducible,
        )
        return self.run(
            project,
            minimum_isolation=minimum_isolation,
            provider=provider,
            limits=limits,
            image=image,
        )

    # --- sessions -----------------------------------------------------------------------

    def open_session(
        self,
        language: str,
        *,
        minimum_isolation: Optional[TierLike] = None,
        provider: Optional[str] = None,
        grant: Optional[str] = None,
        limits: Optional[Limits] = None,
        idle_timeout_ms: Optional[int] = None,
        max_lifetime_ms: Optional[int] = None,
        image: Optional[str] = None,
    ) -> Session:
        """Opens a session: one sandbox kept across calls, with an interpreter of
        ``language`` (``javascript`` or ``python``). Checked before it is returned: the echoed
        request id, its tier against the floor (the one given, or the daemon's default), the
        floor it holds, the provider and the image named. A session that fails a check is
        closed again. ``limits``: ``memory_bytes``, ``pids`` and ``disk_bytes`` hold for its
        whole life; ``timeout_ms``, ``output_bytes`` and ``artifact_bytes`` are each call's
        defaults. ``image``: the image it runs in (a name or an identity), fixed at open; every
        call's record must name it too. ``grant``: a grant profile the operator defined (an API
        grant or an egress grant), held for the session's whole life; each call's result lists
        the broker calls (``result.calls``) and egress receipts (``result.egress``) since the
        call before, and a call cannot name a grant of its own."""
        p = self._prepare_open(
            language,
            minimum_isolation=minimum_isolation,
            provider=provider,
            grant=grant,
            limits=limits,
            idle_timeout_ms=idle_timeout_ms,
            max_lifetime_ms=max_lifetime_ms,
            image=image,
        )
        default_floor = None
        if p.floor is None:
            try:
                default_floor = self.default_floor()
            except PlimsollError as e:
                raise _verify.floor_unknown(e, p.request_id) from None
        args = self._open_stream(p)
        try:
            with self._http.stream(**args) as r:
                status, body = r.status_code, read_capped(r.iter_bytes())
        except FAILED as e:
            raise self._failed(args["url"], p.request_id, e) from None
        info = _session.read_opened(p, status, body)
        session = Session(self, info, Chain(info, 0, None, p.image))
        problem = _session.check_opened(p, info, default_floor)
        if problem is not None:
            try:
                session.close()
            except PlimsollError as e:
                problem.close_error = e
            raise problem
        return session

    def session(self, session_id: str) -> Session:
        """This caller's open session ``session_id``, resumed where the daemon says its
        chain stands (its last call's sequence and record digest): for a caller that did not
        open it in this process. A session opened here keeps its own chain."""
        sid = _session.check_session_id(session_id)
        url = _session.session_url(self._base_url, sid)
        try:
            with self._http.stream(**self._get_stream(url)) as r:
                status, body = r.status_code, read_capped(r.iter_bytes())
        except FAILED as e:
            raise self._sessions_failed(url, e, sid) from None
        info = _session.read_shown(url, sid, status, body)
        return Session(self, info, Chain(info, info.calls, info.last_record_sha256))

    def list_sessions(self) -> SessionList:
        """This caller's open sessions, oldest first."""
        url = self._sessions_url()
        try:
            with self._http.stream(**self._get_stream(url)) as r:
                status, body = r.status_code, read_capped(r.iter_bytes())
        except FAILED as e:
            raise self._sessions_failed(url, e) from None
        return _session.read_list(url, status, body)

    # --- snapshots ----------------------------------------------------------------------

    def open_snapshot(
        self, snapshot: Union[SnapshotInfo, str], sha256: Optional[str] = None
    ) -> Session:
        """Opens a new session restored from ``snapshot`` (a :class:`SnapshotInfo` from
        :meth:`Session.snapshot`, :meth:`Session.fork` or :meth:`list_snapshots`, or its
        id): the state its session had then, with fresh randomness, its chain going on from
        that session's at the snapshot. ``sha256``: the snapshot's digest, which the daemon
        then requires of its files (given a :class:`SnapshotInfo`, its own is named unless
        this one is). Checked before it is returned: the echoed request id, that it says it
        was restored from that digest (and, given a :class:`SnapshotInfo`, from that
        snapshot's session at that point of its chain, in its provider, tier and language),
        that its chain starts there, and its tier against the floor it holds. A session that
        fails a check is closed again. An unknown, expired or another caller's snapshot is
        refused alike (:class:`NotDispatched`, code ``snapshot_not_found``)."""
        p = _session.prepare_restore(snapshot, sha256)
        args = self._restore_stream(p)
        try:
            with self._http.stream(**args) as r:
                status, body = r.status_code, read_capped(r.iter_bytes())
        except FAILED as e:
            raise self._failed(args["url"], p.request_id, e) from None
        info = _session.read_restored(p, status, body)
        session = Session(self, info, _session.copy_chain(info))
        problem = _session.check_restored(p, info)
        if problem is not None:
            try:
                session.close()
            except PlimsollError as e:
                problem.close_error = e
            raise problem
        return session

    def list_snapshots(self) -> SnapshotList:
        """This caller's snapshots, oldest first."""
        url = _session.snapshots_url(self._base_url)
        try:
            with self._http.stream(**self._get_stream(url)) as r:
                status, body = r.status_code, read_capped(r.iter_bytes())
        except FAILED as e:
            raise self._sessions_failed(url, e) from None
        return _session.read_snapshot_list(url, status, body)

    def delete_snapshot(self, snapshot: Union[SnapshotInfo, str]) -> SnapshotInfo:
        """Deletes ``snapshot`` (a :class:`SnapshotInfo` or its id): its files are removed, and
        it no longer counts against the caller's quota. Sessions opened from it go on. The
        answer is the snapshot deleted, for this request (echoed id)."""
        rid = _verify.new_request_id()
        sid = _session.check_snapshot_id(snapshot, rid)
        args = self._delete_snapshot_stream(rid, sid)
        try:
            with self._http.stream(**args) as r:
                status, body = r.status_code, read_capped(r.iter_bytes())
        except FAILED as e:
            raise self._failed(args["url"], rid, e) from None
        return _session.read_deleted(rid, sid, status, body)

    # --- the daemon ---------------------------------------------------------------------

    def providers(self) -> ProvidersResponse:
        """The daemon's providers, their tiers, availability and evidence (every evidence
        digest recomputed). Also remembers the daemon's default floor."""
        try:
            with self._http.stream(**self._providers_stream()) as r:
                status, body = r.status_code, read_capped(r.iter_bytes())
        except FAILED as e:
            raise self._providers_failed(e) from None
        return self._read_providers(status, body)

    def default_floor(self) -> Tier:
        """The floor the daemon gives a request that sets none (read once, then cached)."""
        if self._default_floor is None:
            self.providers()
        assert self._default_floor is not None
        return self._default_floor

    def is_ready(self) -> bool:
        """True when ``GET /readyz`` answers 200 (every provider probed, one available)."""
        try:
            r = self._http.get(self._readyz_url(), timeout=CONNECT_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return r.status_code == 200


class AsyncClient(_Base):
    """The :class:`Client` for asyncio: the same checks, every method a coroutine. Close it
    with ``await client.aclose()`` or use ``async with``."""

    _HTTP = httpx.AsyncClient
    _http: httpx.AsyncClient

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def run(
        self,
        run: RunSpec,
        *,
        minimum_isolation: Optional[TierLike] = None,
        provider: Optional[str] = None,
        limits: Optional[Limits] = None,
        grant: Optional[str] = None,
        image: Optional[str] = None,
    ) -> RunResponse:
        """Runs ``run`` and returns the verified response."""
        prepared = self._prepare(
            run,
            minimum_isolation=minimum_isolation,
            provider=provider,
            limits=limits,
            grant=grant,
            image=image,
        )
        default_floor = None
        if prepared.floor is None:
            try:
                default_floor = await self.default_floor()
            except PlimsollError as e:
                raise _verify.floor_unknown(e, prepared.request_id) from None
        try:
            async with self._http.stream(**self._run_stream(prepared)) as r:
                status, body = r.status_code, await aread_capped(r.aiter_bytes())
        except FAILED as e:
            raise self._run_failed(prepared, e) from None
        return _verify.verify_answer(prepared, status, body, default_floor)

    async def run_snippet(self, language: str, code: str, **options: Any) -> RunResponse:
        return await self.run(Snippet(language, code), **options)

    async def run_python(self, code: str, **options: Any) -> RunResponse:
        return await self.run(Snippet("python", code), **options)

    async def run_javascript(self, code: str, **options: Any) -> RunResponse:
        return await self.run(Snippet("javascript", code), **options)

    async def run_project(
        self,
        steps: Sequence[Union[Step, str]],
        *,
        files: Iterable[File] = (),
        artifacts: Iterable[str] = (),
        **options: Any,
    ) -> RunResponse:
        return await self.run(_project(steps, files, artifacts), **options)

    async def trial(
        self,
        simulator: str,
        controller: File,
        scenarios: Sequence[File],
        *,
        simulator_sha256: Optional[str] = None,
        first_deadline_ms: Optional[int] = None,
        tick_deadline_ms: Optional[int] = None,
        reproducible: bool = False,
        minimum_isolation: Optional[TierLike] = None,
        provider: Optional[str] = None,
        limits: Optional[Limits] = None,
        image: Optional[str] = None,
    ) -> RunResponse:
        """:meth:`Client.trial`, for asyncio."""
        project = _trial_project(
            simulator,
            controller,
            scenarios,
            simulator_sha256=simulator_sha256,
            first_deadline_ms=first_deadline_ms,
            tick_deadline_ms=tick_deadline_ms,
            reproducible=reproducible,
        )
        return await self.run(
            project,
            minimum_isolation=minimum_isolation,
            provider=provider,
            limits=limits,
            image=image,
        )

    async def open_session(
        self,
        language: str,
        *,
        minimum_isolation: Optional[TierLike] = None,
        provider: Optional[str] = None,
        grant: Optional[str] = None,
        limits: Optional[Limits] = None,
        idle_timeout_ms: Optional[int] = None,
        max_lifetime_ms: Optional[int] = None,
        image: Optional[str] = None,
    ) -> AsyncSession:
        """:meth:`Client.open_session`, for asyncio."""
        p = self._prepare_open(
            language,
            minimum_isolation=minimum_isolation,
            provider=provider,
            grant=grant,
            limits=limits,
            idle_timeout_ms=idle_timeout_ms,
            max_lifetime_ms=max_lifetime_ms,
            image=image,
        )
        default_floor = None
        if p.floor is None:
            try:
                default_floor = await self.default_floor()
            except PlimsollError as e:
                raise _verify.floor_unknown(e, p.request_id) from None
        args = self._open_stream(p)
        try:
            async with self._http.stream(**args) as r:
                status, body = r.status_code, await aread_capped(r.aiter_bytes())
        except FAILED as e:
            raise self._failed(args["url"], p.request_id, e) from None
        info = _session.read_opened(p, status, body)
        session = AsyncSession(self, info, Chain(info, 0, None, p.image))
        problem = _session.check_opened(p, info, default_floor)
        if problem is not None:
            try:
                await session.close()
            except PlimsollError as e:
                problem.close_error = e
            raise problem
        return session

    async def session(self, session_id: str) -> AsyncSession:
        """:meth:`Client.session`, for asyncio."""
        sid = _session.check_session_id(session_id)
        url = _session.session_url(self._base_url, sid)
        try:
            async with self._http.stream(**self._get_stream(url)) as r:
                status, body = r.status_code, await aread_capped(r.aiter_bytes())
        except FAILED as e:
            raise self._sessions_failed(url, e, sid) from None
        info = _session.read_shown(url, sid, status, body)
        return AsyncSession(self, info, Chain(info, info.calls, info.last_record_sha256))

    async def list_sessions(self) -> SessionList:
        """:meth:`Client.list_sessions`, for asyncio."""
        url = self._sessions_url()
        try:
            async with self._http.stream(**self._get_stream(url)) as r:
                status, body = r.status_code, await aread_capped(r.aiter_bytes())
        except FAILED as e:
            raise self._sessions_failed(url, e) from None
        return _session.read_list(url, status, body)

    async def open_snapshot(
        self, snapshot: Union[SnapshotInfo, str], sha256: Optional[str] = None
    ) -> AsyncSession:
        """:meth:`Client.open_snapshot`, for asyncio."""
        p = _session.prepare_restore(snapshot, sha256)
        args = self._restore_stream(p)
        try:
            async with self._http.stream(**args) as r:
                status, body = r.status_code, await aread_capped(r.aiter_bytes())
        except FAILED as e:
            raise self._failed(args["url"], p.request_id, e) from None
        info = _session.read_restored(p, status, body)
        session = AsyncSession(self, info, _session.copy_chain(info))
        problem = _session.check_restored(p, info)
        if problem is not None:
            try:
                await session.close()
            except PlimsollError as e:
                problem.close_error = e
            raise problem
        return session

    async def list_snapshots(self) -> SnapshotList:
        """:meth:`Client.list_snapshots`, for asyncio."""
        url = _session.snapshots_url(self._base_url)
        try:
            async with self._http.stream(**self._get_stream(url)) as r:
                status, body = r.status_code, await aread_capped(r.aiter_bytes())
        except FAILED as e:
            raise self._sessions_failed(url, e) from None
        return _session.read_snapshot_list(url, status, body)

    async def delete_snapshot(self, snapshot: Union[SnapshotInfo, str]) -> SnapshotInfo:
        """:meth:`Client.delete_snapshot`, for asyncio."""
        rid = _verify.new_request_id()
        sid = _session.check_snapshot_id(snapshot, rid)
        args = self._delete_snapshot_stream(rid, sid)
        try:
            async with self._http.stream(**args) as r:
                status, body = r.status_code, await aread_capped(r.aiter_bytes())
        except FAILED as e:
            raise self._failed(args["url"], rid, e) from None
        return _session.read_deleted(rid, sid, status, body)

    async def providers(self) -> ProvidersResponse:
        try:
            async with self._http.stream(**self._providers_stream()) as r:
                status, body = r.status_code, await aread_capped(r.aiter_bytes())
        except FAILED as e:
            raise self._providers_failed(e) from None
        return self._read_providers(status, body)

    async def default_floor(self) -> Tier:
        if self._default_floor is None:
            await self.providers()
        assert self._default_floor is not None
        return self._default_floor

    async def is_ready(self) -> bool:
        try:
            r = await self._http.get(self._readyz_url(), timeout=CONNECT_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return r.status_code == 200
