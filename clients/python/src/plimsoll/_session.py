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
    RunResponse,
    SessionInfo,
    SessionList,
    Step,
    Tier,
    TierLike,
    WireError,
    as_tier,
    check_image_selector,
    is_session_id,
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
    rid = p.request_id
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
    id, provider, tier, evidence and environment, fixed at open, and the image its open
    named, if it named one). A call whose answer could not be verified puts the chain in
    doubt until :meth:`resync`."""

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

    def resync(self, info: SessionInfo) -> None:
        """Takes the daemon's word (``GET /v1/sessions/{id}``) for where the chain stands."""
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
        for name in (
            "session_id", "provider", "isolation", "evidence_sha256", "environment", "image"
        ):
            was, now = getattr(self.info, name), getattr(info, name)
            if was != now:
                return f"with {name} {now}, not {was} as at open"
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
        for field, expected, got in (
            ("provider", self.info.provider, response.provider),
            ("isolation", self.info.isolation.value, response.isolation.value),
            ("evidence_sha256", self.info.evidence_sha256, rec.evidence_sha256),
            ("environment", self.info.environment, rec.environment),
        ):
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
        self.info = replace(self.info, calls=link.sequence, last_record_sha256=rec.record_sha256)
        return response


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
