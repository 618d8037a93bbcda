"""What the sessions API (docs/sessions.md) adds around the HTTP exchanges, shared by the sync
and async sessions: the open request and the checks on its answer, the requests a file's PUT
and GET stand for, the reading of a streamed answer line by line, and the session's chain,
which every call's verified record must follow. No I/O here."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, Union
from urllib.parse import quote

from . import _verify
from ._digest import encode_bytes
from ._http import AnswerTooLarge
from ._types import (
    PROTOCOL,
    EndReason,
    File,
    Limits,
    OutputChunk,
    Project,
    ForkAnswer,
    RunResponse,
    SessionInfo,
    SessionList,
    SessionOrigin,
    SessionStart,
    SnapshotInfo,
    SnapshotList,
    Step,
    Tier,
    TierLike,
    WireError,
    as_tier,
    check_image_selector,
    is_session_id,
    is_sha256,
    is_snapshot_id,
)
from ._verify import (
    EXCHANGE_SLACK_S,
    LANGUAGES,
    MAX_ANSWER_BYTES,
    Prepared,
    loads_strict,
    new_request_id,
)
from .errors import (
    BadResponse,
    ChainInDoubt,
    ChainMismatch,
    EvidenceMismatch,
    ImageMismatch,
    InvalidRequest,
    PlimsollError,
    ProviderMismatch,
    RecordMismatch,
    RequestIdMismatch,
    RequestTooLarge,
    SessionsError,
)

NDJSON = "application/x-ndjson"
"""The media type of a streamed answer."""

REQUEST_ID_HEADER = "plimsoll-request-id"
"""The header carrying the request id of a request without a JSON body (a file's PUT and GET,
and DELETE)."""

SESSION_FLOOR = "the session's floor"


# --- open -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreparedOpen:
    """A ``POST /v1/sessions`` ready to send, and what its answer is checked against."""

    request_id: str
    body: bytes
    language: str
    floor: Optional[Tier]
    provider: Optional[str]
    image: Optional[str] = None
    """The image the open named (a name or an identity): the session, and every call's record,
    must name it."""


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 64:
        raise ValueError(f"{name} must be an integer greater than 0")
    return value


def prepare_open(
    language: str,
    *,
    minimum_isolation: Optional[TierLike] = None,
    provider: Optional[str] = None,
    grant: Optional[str] = None,
    limits: Optional[Limits] = None,
    idle_timeout_ms: Optional[int] = None,
    max_lifetime_ms: Optional[int] = None,
    image: Optional[str] = None,
    max_body_bytes: int = _verify.DEFAULT_MAX_BODY_BYTES,
) -> PreparedOpen:
    """Builds and checks an open request; raises :class:`InvalidRequest` (not dispatched)
    before anything is sent."""
    rid = new_request_id()
    try:
        if language not in LANGUAGES:
            raise ValueError(f"language {language!r} is not a language: use javascript or python")
        floor = as_tier(minimum_isolation) if minimum_isolation is not None else None
        if provider is not None and (not isinstance(provider, str) or not provider):
            raise ValueError("provider must not be empty: omit it to let the server choose")
        if grant is not None and (not isinstance(grant, str) or not grant):
            raise ValueError("grant must not be empty: omit it for a session without grants")
        request: dict[str, Any] = {"protocol": PROTOCOL, "request_id": rid, "language": language}
        if floor is not None:
            request["minimum_isolation"] = floor.value
        if provider is not None:
            request["provider"] = provider
        if grant is not None:
            request["grant"] = grant
        if limits is not None:
            wire = limits.to_wire()
            for name, value in wire.items():
                _positive(f"limits.{name}", value)
            request["limits"] = wire
        if idle_timeout_ms is not None:
            request["idle_timeout_ms"] = _positive("idle_timeout_ms", idle_timeout_ms)
        if max_lifetime_ms is not None:
            request["max_lifetime_ms"] = _positive("max_lifetime_ms", max_lifetime_ms)
        if image is not None:
            request["image"] = check_image_selector(image)
        body = json.dumps(request, separators=(",", ":")).encode("utf-8")
    except ValueError as e:
        raise InvalidRequest(str(e), request_id=rid) from None
    if len(body) > max_body_bytes:
        raise RequestTooLarge(len(body), max_body_bytes, request_id=rid)
    return PreparedOpen(rid, body, language, floor, provider, image)


def _read_info(body: bytes, what: str) -> SessionInfo:
    return SessionInfo.from_wire(loads_strict(body), what)


def read_opened(p: PreparedOpen, status: int, body: bytes) -> SessionInfo:
    """The session an answer to ``p`` opened, once it is this request's (echoed id) and well
    formed; any other answer raises the error it amounts to (a refusal is believed only with
    the echoed id)."""
    return _read_answered_info(p.request_id, status, body)


def _read_answered_info(rid: str, status: int, body: bytes) -> SessionInfo:
    if status != 200:
        raise _verify.error_for(rid, status, body)
    try:
        info = _read_info(body, "the session")
    except WireError as e:
        raise BadResponse(f"not a session: {e}", request_id=rid, status=status) from None
    if info.request_id != rid:
        raise RequestIdMismatch(sent=rid, echoed=info.request_id or "(none)")
    if info.protocol != PROTOCOL:
        raise BadResponse(
            f"the session speaks protocol {info.protocol}, this client protocol {PROTOCOL}",
            request_id=rid,
            status=status,
        )
    return info


_OPENED_THERE = "the session was opened there, and this client closes it"


def check_opened(
    p: PreparedOpen, info: SessionInfo, default_floor: Optional[Tier]
) -> Optional[PlimsollError]:
    """What is wrong with a session this request opened, or ``None``: its tier against the
    floor (the one sent, or the daemon's default), the floor it says it holds, the provider
    and the image named, its language, and that it is fresh. The caller closes a session that
    fails."""
    rid = p.request_id
    floor = p.floor if p.floor is not None else default_floor
    if floor is not None and info.isolation < floor:
        return EvidenceMismatch(
            request_id=rid,
            provider=info.provider,
            isolation=info.isolation,
            floor=floor,
            default=p.floor is None,
            subject="the session",
            outcome=_OPENED_THERE,
        )
    if info.isolation < info.minimum_isolation:
        return EvidenceMismatch(
            request_id=rid,
            provider=info.provider,
            isolation=info.isolation,
            floor=info.minimum_isolation,
            default=False,
            which="the floor the session says it holds",
            subject="the session",
            outcome=_OPENED_THERE,
        )
    if floor is not None and info.minimum_isolation != floor:
        return RecordMismatch(
            field="minimum_isolation",
            response=floor.value,
            record=info.minimum_isolation.value,
            request_id=rid,
            against="the floor sent" if p.floor is not None else _verify.DAEMON_DEFAULT_FLOOR,
            subject="the session",
        )
    if p.provider is not None and info.provider != p.provider:
        return ProviderMismatch(
            request_id=rid,
            asked=p.provider,
            provider=info.provider,
            subject="the session",
            outcome=_OPENED_THERE,
        )
    if p.image is not None:
        wrong = _verify.image_mismatch(
            p.image, info.image, request_id=rid, subject="the session", outcome=_OPENED_THERE
        )
        if wrong is not None:
            return wrong
    problem = None
    if info.language != p.language:
        problem = f"the session's language is {info.language}, not {p.language} as asked"
    elif info.calls != 0 or info.last_record_sha256 is not None:
        problem = f"a session just opened has answered {info.calls} calls already"
    elif info.end_reason is not None:
        problem = f"a session just opened says it has ended ({info.end_reason})"
    elif info.origin is not None:
        problem = (
            f"a session just opened says it was {info.origin.start} from a snapshot of "
            f"{info.origin.parent_session_id}"
        )
    if problem is not None:
        return BadResponse(problem, request_id=rid, status=200)
    return None


# --- show, list, close ------------------------------------------------------------------


def check_session_id(session_id: Any) -> str:
    if not is_session_id(session_id):
        raise InvalidRequest(
            f"{session_id!r} is not a session id (`ses_`, 16 and 32 lowercase hex digits "
            "joined by `_`): use the session_id a session was opened with"
        )
    return session_id


def _sessions_failure(url: str, status: int, body: bytes, session_id: Optional[str]) -> SessionsError:
    try:
        a = _verify.read_error(body)
    except WireError as e:
        return SessionsError(
            f"unreadable answer from {url} (HTTP {status}): {e}",
            status=status,
            session_id=session_id,
        )
    ended = f"; it ended: {a.end_reason}" if a.end_reason is not None else ""
    return SessionsError(
        f"the daemon at {url} answered HTTP {status} ({a.code}): {a.message}{ended}",
        status=status,
        code=a.code,
        reason=a.reason,
        end_reason=a.end_reason,
        session_id=session_id,
    )


def read_shown(url: str, session_id: str, status: int, body: bytes) -> SessionInfo:
    """The answer to ``GET /v1/sessions/{id}``."""
    if status != 200:
        raise _sessions_failure(url, status, body, session_id)
    try:
        info = _read_info(body, "the session")
    except WireError as e:
        raise SessionsError(
            f"unreadable answer from {url}: not a session: {e}", status=status,
            session_id=session_id,
        ) from None
    problem = None
    if info.session_id != session_id:
        problem = f"it shows session {info.session_id}"
    elif info.isolation < info.minimum_isolation:
        problem = f"its tier {info.isolation} is below the floor {info.minimum_isolation} it holds"
    elif (info.calls == 0) != (info.last_record_sha256 is None):
        problem = f"it has answered {info.calls} calls, and last_record_sha256 disagrees"
    elif info.origin is not None and info.calls < info.origin.parent_calls:
        problem = (
            f"it has answered {info.calls} calls, fewer than the {info.origin.parent_calls} "
            "its chain goes on from"
        )
    if problem is not None:
        raise SessionsError(
            f"the daemon's answer about session {session_id} is not consistent: {problem}",
            status=status,
            session_id=session_id,
        )
    return info


def read_list(url: str, status: int, body: bytes) -> SessionList:
    """The answer to ``GET /v1/sessions``."""
    if status != 200:
        raise _sessions_failure(url, status, body, None)
    try:
        return SessionList.from_wire(loads_strict(body))
    except WireError as e:
        raise SessionsError(
            f"unreadable answer from {url}: not a session list: {e}", status=status
        ) from None


def read_closed(request_id: str, session_id: str, status: int, body: bytes) -> SessionInfo:
    """The answer to ``DELETE /v1/sessions/{id}`` sent with ``request_id``: the session, ended
    ``closed``; a refusal is believed only with the echoed id."""
    if status != 200:
        raise _verify.error_for(request_id, status, body)
    try:
        info = _read_info(body, "the closed session")
    except WireError as e:
        raise BadResponse(f"not a session: {e}", request_id=request_id, status=status) from None
    if info.request_id != request_id:
        raise RequestIdMismatch(sent=request_id, echoed=info.request_id or "(none)")
    problem = None
    if info.session_id != session_id:
        problem = f"the close answered for session {info.session_id}, not {session_id}"
    elif info.end_reason is not EndReason.CLOSED:
        problem = f"the close answered end reason {info.end_reason}, not closed"
    if problem is not None:
        raise BadResponse(problem, request_id=request_id, status=status)
    return info


# --- calls ------------------------------------------------------------------------------


def session_url(base_url: str, session_id: str, tail: str = "") -> str:
    return f"{base_url}/v1/sessions/{session_id}{tail}"


def file_url(base_url: str, session_id: str, path: str) -> str:
    # Each segment percent-encoded; the daemon decodes the path before it makes the request
    # the call stands for, so the digest is over the path as given here.
    return session_url(base_url, session_id, "/files/" + quote(path, safe="/"))


def prepare_call(
    run: Union[Project, Any],
    *,
    timeout_ms: Optional[int],
    max_body_bytes: int,
) -> Prepared:
    """A cell's or steps' request: no floor and no provider of its own (the session's hold),
    a timeout if asked. A project may have no step when it has files or artifacts."""
    return _verify.prepare(
        run,
        limits=Limits(timeout_ms=timeout_ms) if timeout_ms is not None else None,
        max_body_bytes=max_body_bytes,
        steps_required=False,
    )


def project(
    steps: Sequence[Union[Step, str]], files: Sequence[File], artifacts: Sequence[str]
) -> Project:
    if isinstance(steps, (str, bytes)):
        raise InvalidRequest("steps must be a list of commands, not one string")
    return Project(steps=list(steps), files=list(files), artifacts=list(artifacts))


@dataclass(frozen=True)
class PreparedFile:
    """A file's PUT or GET: the run request it stands for (its digest is what the record
    names), and, for a PUT, the bytes sent."""

    prepared: Prepared
    path: str
    content: Optional[bytes]


def prepare_put(path: str, content: Any, max_body_bytes: int) -> PreparedFile:
    rid = new_request_id()
    try:
        _verify._check_path(path, "path")
        if isinstance(content, str):
            raise ValueError("content must be bytes (encode text first: exact bytes are put)")
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise ValueError(f"content must be bytes, not {type(content).__name__}")
    except ValueError as e:
        raise InvalidRequest(str(e), request_id=rid) from None
    raw = bytes(content)
    if len(raw) > max_body_bytes:
        raise RequestTooLarge(len(raw), max_body_bytes, request_id=rid)
    stands_for = {
        "protocol": PROTOCOL,
        "request_id": rid,
        "run": {"kind": "project", "files": [{"path": path, "content": encode_bytes(raw)}], "steps": []},
    }
    return PreparedFile(_stand_in(rid, stands_for), path, raw)


def prepare_get(path: str) -> PreparedFile:
    rid = new_request_id()
    try:
        _verify._check_path(path, "path")
    except ValueError as e:
        raise InvalidRequest(str(e), request_id=rid) from None
    stands_for = {
        "protocol": PROTOCOL,
        "request_id": rid,
        "run": {"kind": "project", "artifacts": [path], "steps": []},
    }
    return PreparedFile(_stand_in(rid, stands_for), path, None)


def _stand_in(rid: str, request: dict[str, Any]) -> Prepared:
    body = json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return Prepared(
        request_id=rid,
        body=body,
        sent=loads_strict(body),
        floor=None,
        provider=None,
        budget_s=_verify.DEFAULT_RUN_BUDGET_S + EXCHANGE_SLACK_S,
    )


def file_headers(rid: str) -> dict[str, str]:
    return {REQUEST_ID_HEADER: rid, "content-type": "application/octet-stream"}


def got_file(pf: PreparedFile, response: RunResponse) -> Any:
    """The artifact a verified GET answered: its path must be the one asked."""
    arts = response.result.artifacts
    if len(arts) != 1 or arts[0].path != pf.path:
        raise BadResponse(
            f"the file call for `{pf.path}` answered artifacts "
            f"{[a.path for a in arts]!r}, not exactly that one",
            request_id=pf.prepared.request_id,
            status=200,
        )
    return arts[0]


# --- the chain --------------------------------------------------------------------------


class Chain:
    """Where a session's chain stands as this client saw it: the sequence number and record
    digest of the last call answered, and what every call's record must say (the session's
    id, provider, tier, evidence and environment, fixed at open, the image its open named, if
    it named one, and where it came from, if it was restored or forked). A call whose answer
    could not be verified puts the chain in doubt until :meth:`resync`. A restored or forked
    session's chain starts where its info says (:func:`copy_chain`): its parent's.

    One change is allowed: a session the daemon saved on its SIGTERM and the next daemon
    restored under its own id (:meth:`restored_here`). From the call after the last one saved,
    its records carry that restore as their origin, and its tier and evidence are the ones the
    restoring daemon measured; its provider, environment and image stay the session's."""

    def __init__(
        self,
        info: SessionInfo,
        sequence: int,
        previous: Optional[str],
        image: Optional[str] = None,
    ) -> None:
        self.info = info
        self.sequence = sequence
        self.previous = previous
        self.image = image
        self.in_doubt: Optional[str] = None

    def check_sendable(self, request_id: str) -> None:
        if self.in_doubt is not None:
            raise ChainInDoubt(
                session_id=self.info.session_id, request_id=request_id, earlier=self.in_doubt
            )

    def doubt(self, request_id: str) -> None:
        if self.in_doubt is None:
            self.in_doubt = request_id

    def restored_here(self, origin: Optional[SessionOrigin]) -> bool:
        """Whether ``origin`` says this session was restored under its own id (a daemon
        restart saved it and the next daemon restored it) right after the last call this
        client saw: its parent is this session, at this chain's call and record."""
        return (
            origin is not None
            and origin.start is SessionStart.RESTORED
            and origin.parent_session_id == self.info.session_id
            and origin.parent_calls == self.sequence
            and origin.parent_record_sha256 == self.previous
        )

    def resync(self, info: SessionInfo) -> None:
        """Takes the daemon's word (``GET /v1/sessions/{id}``) for where the chain stands. A
        session restored under its own id after a daemon restart, right after the last call
        this client saw, is taken with its new origin, tier and evidence."""
        fixed = self._fixed_problem(info)
        if fixed is not None:
            raise SessionsError(
                f"the daemon now shows session {self.info.session_id} {fixed}",
                session_id=self.info.session_id,
            )
        self.sequence, self.previous = info.calls, info.last_record_sha256
        self.info = info
        self.in_doubt = None

    def _fixed_problem(self, info: SessionInfo) -> Optional[str]:
        restored = info.origin != self.info.origin and self.restored_here(info.origin)
        for name in ("session_id", "provider", "environment", "image"):
            was, now = getattr(self.info, name), getattr(info, name)
            if was != now:
                return f"with {name} {now}, not {was} as at open"
        if restored:
            return None
        if info.origin != self.info.origin:
            return (
                f"with origin {origin_text(info.origin)}, not {origin_text(self.info.origin)}: "
                "an origin changes only when a daemon restart restored the session under its "
                f"own id right after the last call this client saw (call {self.sequence}); "
                "open it again with Client.session() to take the daemon's word for its chain"
            )
        for name in ("isolation", "evidence_sha256"):
            was, now = getattr(self.info, name), getattr(info, name)
            if was != now:
                return (
                    f"with {name} {now}, not {was}: they change only where a daemon restart "
                    "restored the session"
                )
        return None

    def follow(self, prepared: Prepared, response: RunResponse) -> RunResponse:
        """Checks a verified call's place in the chain, and moves the chain on."""
        sid = self.info.session_id
        rid = prepared.request_id
        link = response.record.session

        def mismatch(field: str, expected: Any, got: Any, why: str) -> ChainMismatch:
            return ChainMismatch(
                session_id=sid, request_id=rid, field=field, expected=str(expected),
                got=str(got), why=why,
            )

        if link is None:
            raise mismatch("session", sid, "absent", "the record of a session call names no session")
        if link.session_id != sid:
            raise mismatch("session_id", sid, link.session_id, "the record names another session")
        # A restored or forked session's every record says where it came from, as its info
        # does; a fresh session's never does. Only a restore of this session under its own id
        # (a daemon restart), at the call after the last one seen here, brings a new origin:
        # its sequence and previous record are checked next, as every call's are.
        restored = link.origin != self.info.origin and self.restored_here(link.origin)
        if link.origin != self.info.origin and not restored:
            raise mismatch(
                "origin",
                origin_text(self.info.origin),
                origin_text(link.origin),
                "every record of a restored or forked session carries the session's origin, "
                "and no other session's record carries one; it changes only where a daemon "
                "restart restored the session, right after its last call",
            )
        gap = "a call of this session is missing, repeated or reordered, or another call's answer"
        if link.sequence != self.sequence + 1:
            raise mismatch("sequence", self.sequence + 1, link.sequence, gap)
        if link.previous_record_sha256 != self.previous:
            raise mismatch(
                "previous_record_sha256",
                self.previous or "(none)",
                link.previous_record_sha256 or "(none)",
                gap,
            )
        rec = response.record
        # Restored, the session runs in the sandbox the restoring daemon made: its tier and
        # evidence are that daemon's from here on (the floor still holds: the call's answer
        # was verified against it); its provider and environment stay the session's.
        fixed = [("provider", self.info.provider, response.provider)]
        if not restored:
            fixed += [
                ("isolation", self.info.isolation.value, response.isolation.value),
                ("evidence_sha256", self.info.evidence_sha256, rec.evidence_sha256),
            ]
        fixed.append(("environment", self.info.environment, rec.environment))
        for field, expected, got in fixed:
            if expected != got:
                raise mismatch(field, expected, got, "the call ran elsewhere than the session")
        # The image the open named, like the session's tier: every call's record must say the
        # call ran in it.
        if self.image is not None:
            wrong = _verify.image_mismatch(
                self.image,
                rec.image,
                request_id=rid,
                subject="the session call",
                outcome="the call ran, but not in the image the session was opened with",
            )
            if wrong is not None:
                raise wrong
        self.sequence, self.previous = link.sequence, rec.record_sha256
        info = self.info
        if restored:
            info = replace(
                info,
                origin=link.origin,
                isolation=response.isolation,
                evidence_sha256=rec.evidence_sha256,
            )
        self.info = replace(info, calls=link.sequence, last_record_sha256=rec.record_sha256)
        return response


def origin_text(origin: Optional[SessionOrigin]) -> str:
    """An origin for a message: how the session began, and where its chain hangs from."""
    if origin is None:
        return "(none)"
    return (
        f"{origin.start} from snapshot {origin.snapshot_sha256} of {origin.parent_session_id} "
        f"after its call {origin.parent_calls} ({origin.parent_record_sha256 or 'no record'})"
    )


def copy_chain(info: SessionInfo, image: Optional[str] = None) -> Chain:
    """The chain of a session restored from a snapshot, or forked: it goes on from where its
    info says, its parent's chain at the snapshot (checked against its origin before it is
    handed out); ``image`` is what the parent's open named, if anything."""
    return Chain(info, info.calls, info.last_record_sha256, image)


# --- snapshots and forks ----------------------------------------------------------------

MAX_FORK_COUNT = (1 << 32) - 1
"""The largest count a fork request can carry; the daemon's ``[sessions] max_fork`` (8 by
default) is the real limit, and a count above it is refused there."""


def snapshots_url(base_url: str, snapshot_id: str = "", tail: str = "") -> str:
    return f"{base_url}/v1/snapshots" + (f"/{snapshot_id}{tail}" if snapshot_id else "")


def _small_body(request: dict[str, Any]) -> bytes:
    return json.dumps(request, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True)
class PreparedSnapshot:
    """A ``POST /v1/sessions/{id}/snapshot``, or (``count`` set) ``.../fork``, ready to
    send."""

    request_id: str
    body: bytes
    count: Optional[int] = None


def prepare_snapshot() -> PreparedSnapshot:
    rid = new_request_id()
    return PreparedSnapshot(rid, _small_body({"protocol": PROTOCOL, "request_id": rid}))


def prepare_fork(count: Any) -> PreparedSnapshot:
    """A fork request; a count that is not a whole number of copies, at least 1, is refused
    unsent (:class:`InvalidRequest`)."""
    rid = new_request_id()
    if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_FORK_COUNT:
        raise InvalidRequest(
            f"count must be a whole number of copies, at least 1 (at most the daemon's "
            f"max_fork, 8 unless its operator set another), not {count!r}",
            request_id=rid,
        )
    body = _small_body({"protocol": PROTOCOL, "request_id": rid, "count": count})
    return PreparedSnapshot(rid, body, count)


@dataclass(frozen=True)
class PreparedRestore:
    """A ``POST /v1/snapshots/{id}/sessions`` ready to send, and what its answer is checked
    against: the digest it names, and the snapshot as this client read it, if it was given
    one."""

    request_id: str
    body: bytes
    snapshot_id: str
    sha256: Optional[str]
    known: Optional[SnapshotInfo]


def check_snapshot_id(snapshot: Any, request_id: Optional[str] = None) -> str:
    """The id of ``snapshot`` (a :class:`SnapshotInfo` or its id), or :class:`InvalidRequest`
    for what is not one (nothing sent)."""
    sid = snapshot.snapshot_id if isinstance(snapshot, SnapshotInfo) else snapshot
    if not is_snapshot_id(sid):
        raise InvalidRequest(
            f"{sid!r} is not a snapshot id (`snp_`, 16 and 32 lowercase hex digits joined by "
            "`_`): use the snapshot_id a snapshot, a fork or list_snapshots() answered",
            request_id=request_id,
        )
    return sid


def prepare_restore(snapshot: Any, sha256: Optional[str]) -> PreparedRestore:
    """An open-from-snapshot request. Given a :class:`SnapshotInfo`, it names that snapshot's
    digest (so the daemon refuses a snapshot whose files changed) unless ``sha256`` names
    one, which must then be the same."""
    rid = new_request_id()
    snapshot_id = check_snapshot_id(snapshot, rid)
    known = snapshot if isinstance(snapshot, SnapshotInfo) else None
    if sha256 is not None and not is_sha256(sha256):
        raise InvalidRequest(
            f"sha256 must be 64 lowercase hex digits (the snapshot's `sha256`), not {sha256!r}",
            request_id=rid,
        )
    if known is not None:
        if sha256 is not None and sha256 != known.sha256:
            raise InvalidRequest(
                f"sha256 {sha256} is not the digest of snapshot {snapshot_id} ({known.sha256}): "
                "leave it out to name the snapshot's own",
                request_id=rid,
            )
        sha256 = known.sha256
    request: dict[str, Any] = {"protocol": PROTOCOL, "request_id": rid}
    if sha256 is not None:
        request["sha256"] = sha256
    return PreparedRestore(rid, _small_body(request), snapshot_id, sha256, known)


def _read_snapshot(rid: str, status: int, body: bytes, what: str) -> SnapshotInfo:
    if status != 200:
        raise _verify.error_for(rid, status, body)
    try:
        snap = SnapshotInfo.from_wire(loads_strict(body), what)
    except WireError as e:
        raise BadResponse(f"not a snapshot: {e}", request_id=rid, status=status) from None
    if snap.request_id != rid:
        raise RequestIdMismatch(sent=rid, echoed=snap.request_id or "(none)")
    _check_protocol(snap.protocol, rid, status, what)
    return snap


def _check_protocol(protocol: int, rid: str, status: int, what: str) -> None:
    if protocol != PROTOCOL:
        raise BadResponse(
            f"{what} speaks protocol {protocol}, this client protocol {PROTOCOL}",
            request_id=rid,
            status=status,
        )


def _snapshot_problem(rid: str, chain: Chain, snap: SnapshotInfo) -> Optional[PlimsollError]:
    """What is wrong with a snapshot said to be taken of the session whose chain is ``chain``:
    it is of another session, or of another provider, tier or language, or taken at another
    point of the chain than this client's last call."""
    info = chain.info

    def mismatch(field: str, expected: Any, got: Any, why: str) -> ChainMismatch:
        return ChainMismatch(
            session_id=info.session_id, request_id=rid, field=f"snapshot.{field}",
            expected=str(expected), got=str(got), why=why,
        )

    if snap.session_id != info.session_id:
        return mismatch(
            "session_id", info.session_id, snap.session_id, "a snapshot of another session"
        )
    for field, expected, got in (
        ("provider", info.provider, snap.provider),
        ("isolation", info.isolation.value, snap.isolation.value),
        ("language", info.language, snap.language),
    ):
        if expected != got:
            return mismatch(
                field, expected, got, "the snapshot says another sandbox than the session's"
            )
    where = "the snapshot was taken elsewhere in the session's chain than after its last call"
    if snap.calls != chain.sequence:
        return mismatch("calls", chain.sequence, snap.calls, where)
    if snap.last_record_sha256 != chain.previous:
        return mismatch(
            "last_record_sha256", chain.previous or "(none)", snap.last_record_sha256 or "(none)",
            where,
        )
    return None


def read_snapshot(p: PreparedSnapshot, chain: Chain, status: int, body: bytes) -> SnapshotInfo:
    """The answer to ``POST /v1/sessions/{id}/snapshot``: this request's (echoed id), a
    snapshot of this session where its chain stands."""
    snap = _read_snapshot(p.request_id, status, body, "the snapshot")
    wrong = _snapshot_problem(p.request_id, chain, snap)
    if wrong is not None:
        raise wrong
    return snap


def read_deleted(request_id: str, snapshot_id: str, status: int, body: bytes) -> SnapshotInfo:
    """The answer to ``DELETE /v1/snapshots/{id}`` sent with ``request_id``: the snapshot
    deleted; a refusal is believed only with the echoed id."""
    snap = _read_snapshot(request_id, status, body, "the deleted snapshot")
    if snap.snapshot_id != snapshot_id:
        raise BadResponse(
            f"the delete answered for snapshot {snap.snapshot_id}, not {snapshot_id}",
            request_id=request_id,
            status=status,
        )
    return snap


def read_snapshot_list(url: str, status: int, body: bytes) -> SnapshotList:
    """The answer to ``GET /v1/snapshots``."""
    if status != 200:
        raise _sessions_failure(url, status, body, None)
    try:
        return SnapshotList.from_wire(loads_strict(body))
    except WireError as e:
        raise SessionsError(
            f"unreadable answer from {url}: not a snapshot list: {e}", status=status
        ) from None


def read_fork(p: PreparedSnapshot, status: int, body: bytes) -> ForkAnswer:
    """The answer to a fork, once it is this request's (its echoed id, and its snapshot's and
    every copy's) and well formed; any other answer raises the error it amounts to (a refusal
    is believed only with the echoed id). Its copies are checked by :func:`check_fork`."""
    rid = p.request_id
    if status != 200:
        raise _verify.error_for(rid, status, body)
    try:
        answer = ForkAnswer.from_wire(loads_strict(body))
    except WireError as e:
        raise BadResponse(f"not a fork answer: {e}", request_id=rid, status=status) from None
    for echoed in [answer.request_id, answer.snapshot.request_id] + [
        c.request_id for c in answer.sessions
    ]:
        if echoed != rid:
            raise RequestIdMismatch(sent=rid, echoed=echoed or "(none)")
    _check_protocol(answer.protocol, rid, status, "the fork answer")
    return answer


def check_fork(p: PreparedSnapshot, chain: Chain, answer: ForkAnswer) -> Optional[PlimsollError]:
    """What is wrong with the copies a fork of the session whose chain is ``chain`` answered,
    or ``None``: the snapshot must be of this session where its chain stands, and each copy a
    new session, forked from that snapshot of it, its chain going on from there, in the
    session's sandbox (provider, tier, floor, language, image). The caller closes the copies
    of an answer that fails."""
    rid = p.request_id
    wrong = _snapshot_problem(rid, chain, answer.snapshot)
    if wrong is not None:
        return wrong
    ids = [c.session_id for c in answer.sessions]
    if len(ids) != p.count:
        return BadResponse(
            f"the fork asked for {p.count} copies and the answer holds {len(ids)}",
            request_id=rid,
            status=200,
        )
    if len(set(ids)) != len(ids) or chain.info.session_id in ids:
        return BadResponse(
            "the fork's copies are not each a new session of their own", request_id=rid, status=200
        )
    for info in answer.sessions:
        wrong = copy_problem(
            rid, info, SessionStart.FORKED, answer.snapshot, parent=chain.info, image=chain.image
        )
        if wrong is not None:
            return wrong
    return None


def read_restored(p: PreparedRestore, status: int, body: bytes) -> SessionInfo:
    """The session an open-from-snapshot answer opened, once it is this request's (echoed id)
    and well formed. Checked by :func:`check_restored`."""
    return _read_answered_info(p.request_id, status, body)


def check_restored(p: PreparedRestore, info: SessionInfo) -> Optional[PlimsollError]:
    """What is wrong with a session opened from a snapshot, or ``None``: it must say it was
    restored, from the digest named (if one was) and, when this client was given the
    snapshot, from that snapshot's session at that point of its chain, in its sandbox. The
    caller closes a session that fails."""
    return copy_problem(p.request_id, info, SessionStart.RESTORED, p.known, sha256=p.sha256)


_COPY_OPENED = "the copy was opened there, and this client closes it"


def copy_problem(
    rid: str,
    info: SessionInfo,
    start: SessionStart,
    snap: Optional[SnapshotInfo],
    *,
    sha256: Optional[str] = None,
    parent: Optional[SessionInfo] = None,
    image: Optional[str] = None,
) -> Optional[PlimsollError]:
    """What is wrong with a session restored (or forked: ``start``) from ``snap`` (when
    known), or ``None``. Its origin must say so and name that snapshot, its session and the
    point of its chain; its own chain must start there; and it must run where the snapshot's
    session ran (``parent``, for a fork: its provider, floor, language and image)."""
    sid = info.session_id
    o = info.origin

    def mismatch(field: str, expected: Any, got: Any, why: str) -> ChainMismatch:
        return ChainMismatch(
            session_id=sid, request_id=rid, field=field, expected=str(expected),
            got="(none)" if got is None else str(got), why=why,
        )

    if o is None:
        return mismatch(
            "origin", f"{start} from a snapshot", None,
            "a restored or forked session says where it came from",
        )
    if o.start is not start:
        return mismatch("origin.start", start.value, o.start.value, f"the session was not {start}")
    checks: list[tuple[str, Any, Any, str]] = []
    if snap is not None:
        hang = "the session does not come from the snapshot it was opened from"
        checks += [
            ("origin.parent_session_id", snap.session_id, o.parent_session_id, hang),
            ("origin.snapshot_sha256", snap.sha256, o.snapshot_sha256, hang),
            ("origin.parent_calls", snap.calls, o.parent_calls, hang),
            ("origin.parent_record_sha256", snap.last_record_sha256, o.parent_record_sha256, hang),
        ]
    if sha256 is not None:
        other = "restored from another snapshot than the one named"
        checks.append(("origin.snapshot_sha256", sha256, o.snapshot_sha256, other))
    goes_on = "a restored or forked session's chain goes on from where its origin says"
    checks += [
        ("calls", o.parent_calls, info.calls, goes_on),
        ("last_record_sha256", o.parent_record_sha256, info.last_record_sha256, goes_on),
    ]
    for field, expected, got, why in checks:
        if expected != got:
            return mismatch(field, "(none)" if expected is None else expected, got, why)
    if info.isolation < info.minimum_isolation:
        return EvidenceMismatch(
            request_id=rid,
            provider=info.provider,
            isolation=info.isolation,
            floor=info.minimum_isolation,
            default=False,
            which="the floor the session says it holds",
            subject="the session",
            outcome=_COPY_OPENED,
        )
    if parent is not None:
        if info.isolation < parent.minimum_isolation:
            return EvidenceMismatch(
                request_id=rid,
                provider=info.provider,
                isolation=info.isolation,
                floor=parent.minimum_isolation,
                default=False,
                which="the floor of the session forked",
                subject="the copy",
                outcome=_COPY_OPENED,
            )
        if info.minimum_isolation != parent.minimum_isolation:
            return RecordMismatch(
                field="minimum_isolation",
                response=parent.minimum_isolation.value,
                record=info.minimum_isolation.value,
                request_id=rid,
                against="the floor of the session forked",
                subject="the copy",
            )
        if image is not None:
            wrong: Optional[ImageMismatch] = _verify.image_mismatch(
                image, info.image, request_id=rid, subject="the copy", outcome=_COPY_OPENED
            )
            if wrong is not None:
                return wrong
        elif info.image != parent.image:
            if parent.image is None:
                return BadResponse(
                    f"the copy says it runs in image {info.image}, and the session forked "
                    "in none",
                    request_id=rid,
                    status=200,
                )
            return ImageMismatch(
                request_id=rid,
                asked=parent.image.identity,
                image=info.image,
                subject="the copy",
                outcome=_COPY_OPENED,
            )
    runs = parent if parent is not None else snap
    if runs is not None:
        if info.provider != runs.provider:
            return ProviderMismatch(
                request_id=rid,
                asked=runs.provider,
                provider=info.provider,
                subject="the session",
                outcome=_COPY_OPENED,
            )
        if info.isolation < runs.isolation:
            return EvidenceMismatch(
                request_id=rid,
                provider=info.provider,
                isolation=info.isolation,
                floor=runs.isolation,
                default=False,
                which="the tier of the session it was taken of",
                subject="the session",
                outcome=_COPY_OPENED,
            )
    problem = None
    if runs is not None and info.language != runs.language:
        problem = f"the session's language is {info.language}, not {runs.language} as its parent's"
    elif info.end_reason is not None:
        problem = f"a session just opened says it has ended ({info.end_reason})"
    if problem is not None:
        return BadResponse(problem, request_id=rid, status=200)
    return None


# --- streamed answers -------------------------------------------------------------------

_RESPONSE_HEAD = re.compile(r'\A\s*\{\s*"response"\s*:\s*')
_TAIL = re.compile(r"\s*\}\s*\Z")


def is_streamed(status: int, content_type: Optional[str]) -> bool:
    """Whether an answer is NDJSON lines (a daemon or proxy may still answer whole)."""
    return status == 200 and (content_type or "").split(";")[0].strip().lower() == NDJSON


class Lines:
    """Splits a streamed answer into its lines as bytes arrive, within the answer limit.
    Empty lines are keep-alives (docs/daemon.md): skipped."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._seen = 0

    def feed(self, data: bytes) -> list[bytes]:
        self._seen += len(data)
        if self._seen > MAX_ANSWER_BYTES:
            raise AnswerTooLarge(f"the answer is over {MAX_ANSWER_BYTES} bytes")
        self._buf.extend(data)
        out: list[bytes] = []
        while True:
            i = self._buf.find(b"\n")
            if i < 0:
                return out
            line = bytes(self._buf[:i])
            del self._buf[: i + 1]
            if line.strip():
                out.append(line)

    def rest(self) -> bytes:
        """What came after the last newline (a final line without one)."""
        rest, self._buf = bytes(self._buf), bytearray()
        return rest if rest.strip() else b""


def read_line(
    prepared: Prepared, line: bytes, default_floor: Optional[Tier]
) -> Union[OutputChunk, RunResponse]:
    """One line of a streamed answer: a chunk (a preview), or the final response, verified
    exactly as a whole answer is; a final error line raises the error it amounts to (its mark
    believed only with the echoed id). A line that is none of these is a bad response."""
    rid = prepared.request_id
    try:
        o = loads_strict(line)
        if not isinstance(o, dict) or len(o) != 1 or next(iter(o)) not in (
            "chunk",
            "response",
            "error",
        ):
            raise WireError("a stream line is one object with one member: chunk, response or error")
        (kind, value), = o.items()
        if kind == "chunk":
            return OutputChunk.from_wire(value)
    except WireError as e:
        raise BadResponse(
            f"not a stream line ({e}): {line[:200].decode('utf-8', 'replace')!r}",
            request_id=rid,
            status=200,
        ) from None
    if kind == "error":
        # The stream's own status was 200; the error line is the answer.
        raise _verify.error_for(prepared, 200, value)
    return _verify.verify_value(
        prepared,
        value,
        _response_bytes(line, value),
        default_floor,
        default_floor_name=SESSION_FLOOR,
    )


def _response_bytes(line: bytes, value: Any) -> bytes:
    """The bytes of the final line's response as they came, for a signer or an audit log (the
    compact JSON of its value if they cannot be cut out of the line)."""
    text = line.decode("utf-8")
    m = _RESPONSE_HEAD.match(text)
    if m is not None:
        try:
            _, end = json.JSONDecoder().raw_decode(text, m.end())
        except ValueError:
            end = -1
        if end > 0 and _TAIL.fullmatch(text, end):
            return text[m.end() : end].encode("utf-8")
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
