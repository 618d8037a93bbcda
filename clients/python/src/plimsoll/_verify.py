"""What the client does around the HTTP exchange, shared by the sync and async clients: build
and check a request, and read an answer, verifying every promise of docs/protocol.md ("What a
client must do"). No I/O here."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Union

from . import _digest
from ._types import (
    PROTOCOL,
    EndReason,
    ImageRef,
    Limits,
    Project,
    ProvidersResponse,
    Reason,
    RunResponse,
    RunSpec,
    Snippet,
    Tier,
    TierLike,
    WireError,
    as_tier,
    check_image_selector,
)
from .errors import (
    BadResponse,
    DaemonFailed,
    DigestMismatch,
    EvidenceMismatch,
    ImageMismatch,
    InvalidRequest,
    NotDispatched,
    PlimsollError,
    ProviderMismatch,
    ProvidersError,
    RecordMismatch,
    RequestIdMismatch,
    RequestTooLarge,
    UnverifiedRefusal,
)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest request body sent unless told otherwise: the daemon's default
``[daemon].max_body_bytes``."""

MAX_ANSWER_BYTES = 1 << 30
"""The largest answer read (outputs and artifacts can be large)."""

CONNECT_TIMEOUT_S = 10.0
EXCHANGE_SLACK_S = 120.0
DEFAULT_RUN_BUDGET_S = 600.0
"""A run that sets no timeout may take the daemon's built-in maximum timeout."""

LANGUAGES = ("javascript", "python")


def new_request_id() -> str:
    """A fresh request id: 128 random bits in lowercase hex."""
    return secrets.token_hex(16)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            # Two readers may keep different copies of a duplicated member: refuse it.
            raise WireError(f"the member `{k}` appears twice in one object")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise WireError(f"`{name}` is not JSON")


def loads_strict(body: bytes) -> Any:
    """JSON as the protocol has it: UTF-8, no duplicate member names, no NaN or Infinity."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WireError(f"the body is not UTF-8 ({e.reason})") from None
    try:
        return json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant
        )
    except json.JSONDecodeError as e:
        raise WireError(f"the body is not JSON ({e})") from None


def _preview(body: bytes) -> str:
    return repr(body[:200].decode("utf-8", "replace"))


def _check_path(path: Any, what: str) -> None:
    bad = (
        not isinstance(path, str)
        or not path
        or len(path.encode("utf-8", "surrogatepass")) > 4096
        or path.startswith("/")
        or "\0" in path
        or "\\" in path
        or any(s in ("", ".", "..") for s in path.split("/"))
    )
    if bad:
        raise ValueError(
            f"{what}: path {path!r} must be relative to /work, with no empty, `.` or `..` "
            "segments, no backslash or NUL"
        )


def _check_spec(spec: RunSpec, steps_required: bool = True) -> None:
    """The structural checks the daemon makes too, so a bad request is refused unsent. In a
    session (``steps_required`` false) a project may have no step when it has files or
    artifacts."""
    if isinstance(spec, Snippet):
        if spec.language not in LANGUAGES:
            raise ValueError(
                f"run.language {spec.language!r} is not a language: use javascript or python"
            )
        if not isinstance(spec.code, str) or not spec.code.strip():
            raise ValueError("run.code is empty: send the code to run")
    elif isinstance(spec, Project):
        for name in ("steps", "files", "artifacts"):
            if isinstance(getattr(spec, name), (str, bytes)):
                raise ValueError(f"run.{name} must be a list, not a string")
        if not spec.steps and (steps_required or not (spec.files or spec.artifacts)):
            raise ValueError(
                "run.steps is empty: a project needs at least one step"
                if steps_required
                else "the project is empty: give it steps, files or artifacts"
            )
        for i, step in enumerate(spec.steps):
            run = step if isinstance(step, str) else step.run
            if not isinstance(run, str) or not run.strip():
                raise ValueError(f"run.steps[{i}].run is empty")
        seen: set[str] = set()
        for f in spec.files:
            _check_path(f.path, "run.files")
            if f.path in seen:
                raise ValueError(f"run.files: `{f.path}` appears twice")
            seen.add(f.path)
            if not isinstance(f.content, (bytes, bytearray, memoryview, str)):
                raise ValueError(f"run.files: `{f.path}` content must be bytes or str")
        for a in spec.artifacts:
            _check_path(a, "run.artifacts")
    else:
        raise ValueError(f"run must be a Snippet or a Project, got {type(spec).__name__}")


@dataclass(frozen=True)
class Prepared:
    """A request ready to send: its id, its exact body, the body read back, and what the
    answer is checked against."""

    request_id: str
    body: bytes
    sent: Mapping[str, Any]
    floor: Optional[Tier]
    provider: Optional[str]
    budget_s: float
    image: Optional[str] = None
    """The image the request named (a name or an identity): the answer's record must name it."""


def prepare(
    run: RunSpec,
    *,
    minimum_isolation: Optional[TierLike] = None,
    provider: Optional[str] = None,
    limits: Optional[Limits] = None,
    grant: Optional[str] = None,
    image: Optional[str] = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_id: Optional[str] = None,
    steps_required: bool = True,
) -> Prepared:
    """Builds and checks a request; raises :class:`InvalidRequest` or
    :class:`RequestTooLarge` (both not dispatched) before anything is sent."""
    rid = request_id if request_id is not None else new_request_id()
    try:
        floor = as_tier(minimum_isolation) if minimum_isolation is not None else None
        if provider is not None and (not isinstance(provider, str) or not provider):
            raise ValueError("provider must not be empty: omit it to let the server choose")
        if grant is not None and (not isinstance(grant, str) or not grant):
            raise ValueError("grant must not be empty: omit it for a run without grants")
        if image is not None:
            check_image_selector(image)
        wire_limits = None
        if limits is not None:
            wire_limits = limits.to_wire()
            for name, value in wire_limits.items():
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"limits.{name} must be an integer")
                if not 0 < value < 1 << 64:
                    raise ValueError(f"limits.{name} must be greater than 0")
        _check_spec(run, steps_required)
        # request_id before run: a daemon that refuses a body it does not read whole (413)
        # finds the id in its first bytes and echoes it.
        request: dict[str, Any] = {"protocol": PROTOCOL, "request_id": rid}
        if floor is not None:
            request["minimum_isolation"] = floor.value
        if provider is not None:
            request["provider"] = provider
        if wire_limits is not None:
            request["limits"] = wire_limits
        if grant is not None:
            request["grant"] = grant
        if image is not None:
            request["image"] = image
        request["run"] = run.to_wire()
        try:
            body = json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode(
                "utf-8"
            )
        except UnicodeEncodeError as e:
            raise ValueError(f"the request holds text that is not valid Unicode ({e.reason})")
    except ValueError as e:
        raise InvalidRequest(str(e), request_id=rid) from None
    if len(body) > max_body_bytes:
        raise RequestTooLarge(len(body), max_body_bytes, request_id=rid)
    # Digests are recomputed over exactly the bytes that leave this process.
    sent = loads_strict(body)
    budget = (
        wire_limits["timeout_ms"] / 1000.0
        if wire_limits and "timeout_ms" in wire_limits
        else DEFAULT_RUN_BUDGET_S
    )
    return Prepared(
        request_id=rid,
        body=body,
        sent=sent,
        floor=floor,
        provider=provider,
        budget_s=budget + EXCHANGE_SLACK_S,
        image=image,
    )


def image_mismatch(
    asked: str,
    image: Optional[ImageRef],
    *,
    request_id: str,
    subject: str = "the run",
    outcome: str = "the code ran, but not in the image you named",
) -> Optional[ImageMismatch]:
    """The error when ``image`` (what a record or a session names; ``None``: nothing) is not
    the image ``asked`` names (by name or identity), or ``None`` when it is: a request is never
    served by another image than the one it named."""
    if image is not None and image.answers(asked):
        return None
    return ImageMismatch(
        request_id=request_id, asked=asked, image=image, subject=subject, outcome=outcome
    )


DAEMON_DEFAULT_FLOOR = "the daemon's default floor"


def verify_answer(
    prepared: Prepared,
    status: int,
    body: bytes,
    default_floor: Optional[Tier] = None,
    *,
    default_floor_name: str = DAEMON_DEFAULT_FLOOR,
) -> RunResponse:
    """Reads the daemon's answer to ``prepared``: returns the verified response, or raises the
    error it amounts to. ``default_floor`` is the daemon's (or a session's:
    ``default_floor_name`` says which, for messages), checked when the request set no floor
    of its own."""
    if status != 200:
        raise error_for(prepared, status, body)
    try:
        answer = loads_strict(body)
    except WireError as e:
        raise BadResponse(
            f"not a run response: {e}", request_id=prepared.request_id, status=status
        ) from None
    return verify_value(
        prepared, answer, body, default_floor, default_floor_name=default_floor_name
    )


def verify_value(
    prepared: Prepared,
    answer: Any,
    body: bytes,
    default_floor: Optional[Tier] = None,
    *,
    default_floor_name: str = DAEMON_DEFAULT_FLOOR,
    status: int = 200,
) -> RunResponse:
    """:func:`verify_answer` on a run response already read as JSON (``answer``), whose bytes
    as received are ``body``: the final line of a streamed answer is verified exactly as a
    whole answer is."""
    rid = prepared.request_id
    try:
        response = RunResponse.from_wire(answer)
    except WireError as e:
        raise BadResponse(f"not a run response: {e}", request_id=rid, status=status) from None
    response = replace(response, request_body=prepared.body, body=body)
    for echoed in (response.request_id, response.record.request_id):
        if echoed != rid:
            raise RequestIdMismatch(sent=rid, echoed=echoed)
    if response.protocol != PROTOCOL:
        raise BadResponse(
            f"the result speaks protocol {response.protocol}, this client protocol {PROTOCOL}",
            request_id=rid,
            status=status,
        )
    # The tier comes before the digests: a run below the floor is the fact the caller most
    # needs, and it is an error even if every digest matched.
    floor = prepared.floor if prepared.floor is not None else default_floor
    weakest = min(response.isolation, response.record.isolation)
    if floor is not None and weakest < floor:
        raise EvidenceMismatch(
            request_id=rid,
            provider=response.provider,
            isolation=weakest,
            floor=floor,
            default=prepared.floor is None,
            which=(
                default_floor_name
                if prepared.floor is None and default_floor_name != DAEMON_DEFAULT_FLOOR
                else None
            ),
        )
    # The record states the floor the daemon applied: the one sent, or its default floor when
    # none was sent. It must be there, the tier must meet it (checked first, as above), and it
    # must be the floor this client held the run to: that also catches a daemon whose listing
    # and records disagree.
    applied = response.record.minimum_isolation
    if applied is None:
        raise BadResponse(
            "the record states no applied floor (`record.minimum_isolation`): the daemon is "
            "older than this client or faulty; upgrade plimsolld",
            request_id=rid,
            status=status,
        )
    if weakest < applied:
        raise EvidenceMismatch(
            request_id=rid,
            provider=response.provider,
            isolation=weakest,
            floor=applied,
            default=False,
            applied=True,
        )
    if floor is not None and applied != floor:
        raise RecordMismatch(
            field="minimum_isolation",
            response=floor.value,
            record=applied.value,
            request_id=rid,
            against=("the floor sent" if prepared.floor is not None else default_floor_name),
        )
    if prepared.provider is not None:
        for named in (response.provider, response.record.provider):
            if named != prepared.provider:
                raise ProviderMismatch(request_id=rid, asked=prepared.provider, provider=named)
    # The image named, like the tier: the record must say the code ran in it (by its name or
    # its identity), or it ran elsewhere than asked.
    if prepared.image is not None:
        wrong = image_mismatch(prepared.image, response.record.image, request_id=rid)
        if wrong is not None:
            raise wrong
    # What the types cannot say: a pool member's age only with a warm start, and always
    # with one.
    problem = response.result.start_problem()
    if problem is not None:
        raise BadResponse(problem, request_id=rid, status=status)

    try:
        computed = {
            "request": _digest.request_sha256(prepared.sent),
            "result": _digest.result_sha256(answer["result"]),
            "record": _digest.record_sha256(answer["record"]),
        }
    except _digest.EncodingError as e:
        raise BadResponse(f"cannot encode the answer: {e}", request_id=rid, status=status) from None
    claimed = {
        "request": response.request_sha256,
        "result": response.result_sha256,
        "record": response.record.record_sha256,
    }
    for kind in ("request", "result", "record"):
        if computed[kind] != claimed[kind]:
            raise DigestMismatch(
                kind=kind, computed=computed[kind], claimed=claimed[kind], request_id=rid
            )
    rec = response.record
    for field_name, here, there in (
        ("request_sha256", computed["request"], rec.request_sha256),
        ("result_sha256", computed["result"], rec.result_sha256),
        ("provider", response.provider, rec.provider),
        ("isolation", response.isolation.value, rec.isolation.value),
    ):
        if here != there:
            raise RecordMismatch(field=field_name, response=here, record=there, request_id=rid)
    return response


@dataclass(frozen=True)
class ErrorAnswer:
    """An ErrorResponse, read strictly. Absent and null are the same."""

    request_id: Optional[str]
    code: str
    message: str
    reason: Optional[Reason]
    end_reason: Optional[EndReason]


def read_error(body: Union[bytes, Any]) -> ErrorAnswer:
    """An ErrorResponse from its bytes, or from the JSON value of a stream's error line."""
    o = loads_strict(bytes(body)) if isinstance(body, (bytes, bytearray)) else body
    if not isinstance(o, dict):
        raise WireError("the error answer is not an object")
    unknown = set(o) - {"protocol", "request_id", "error"}
    if unknown:
        raise WireError(f"the error answer has unknown members: {', '.join(sorted(unknown))}")
    err = o.get("error")
    if not isinstance(err, dict):
        raise WireError("the error answer has no `error` object")
    unknown = set(err) - {"code", "message", "not_dispatched", "end_reason"}
    if unknown:
        raise WireError(f"`error` has unknown members: {', '.join(sorted(unknown))}")
    rid = o.get("request_id")
    code, message, mark = err.get("code"), err.get("message"), err.get("not_dispatched")
    ended = err.get("end_reason")
    if rid is not None and not isinstance(rid, str):
        raise WireError("`request_id` is not a string")
    if not isinstance(code, str) or not isinstance(message, str):
        raise WireError("`error.code` and `error.message` must be strings")
    reason = None
    if mark is not None:
        try:
            reason = Reason(mark)
        except ValueError:
            raise WireError(f"`error.not_dispatched` is not a reason: {mark!r}") from None
    end_reason = None
    if ended is not None:
        try:
            end_reason = EndReason(ended)
        except ValueError:
            raise WireError(f"`error.end_reason` is not an end reason: {ended!r}") from None
    return ErrorAnswer(rid, code, message, reason, end_reason)


def error_for(
    prepared: Union[Prepared, str], status: int, body: Union[bytes, Any]
) -> Exception:
    """The error a non-200 answer (or a stream's error line, already read as JSON) amounts to.
    The mark is honoured only when the answer echoes this request's id."""
    rid = prepared if isinstance(prepared, str) else prepared.request_id
    try:
        a = read_error(body)
    except WireError as e:
        shown = _preview(bytes(body)) if isinstance(body, (bytes, bytearray)) else repr(body)[:200]
        return BadResponse(
            f"not an error response ({e}): {shown}", request_id=rid, status=status
        )
    if a.reason is None:
        return DaemonFailed(
            a.message, request_id=rid, code=a.code, status=status, end_reason=a.end_reason
        )
    if a.request_id != rid:
        return UnverifiedRefusal(
            sent=rid, echoed=a.request_id, reason=a.reason, message=a.message, status=status
        )
    return NotDispatched(
        a.reason, a.message, request_id=rid, code=a.code, status=status, end_reason=a.end_reason
    )


def read_providers(status: int, body: bytes, url: str) -> ProvidersResponse:
    """Reads a ``GET /v1/providers`` answer and recomputes every evidence digest."""
    if status != 200:
        try:
            a = read_error(body)
        except WireError as e:
            raise ProvidersError(
                f"unreadable answer from {url} (HTTP {status}): {e}: {_preview(body)}",
                status=status,
            ) from None
        raise ProvidersError(
            f"the daemon at {url} answered HTTP {status} ({a.code}): {a.message}",
            status=status,
            code=a.code,
            reason=a.reason,
        )
    try:
        providers = ProvidersResponse.from_wire(loads_strict(body))
        for p in providers.providers:
            computed = _digest.evidence_sha256(p.evidence)
            if computed != p.evidence_sha256:
                raise DigestMismatch(
                    kind="evidence",
                    computed=computed,
                    claimed=p.evidence_sha256,
                    request_id=None,
                )
    except (WireError, _digest.EncodingError) as e:
        raise ProvidersError(
            f"unreadable answer from {url} (HTTP {status}): not a providers response: {e}",
            status=status,
        ) from None
    return providers


def floor_unknown(err: PlimsollError, request_id: str) -> NotDispatched:
    """A run that set no floor, whose daemon's default floor could not be learnt, is not sent:
    the tier of its result could not be checked."""
    reason = (err.reason if isinstance(err, ProvidersError) else None) or Reason.ENVIRONMENT
    return NotDispatched(
        reason,
        f"the run sets no floor and the daemon's default floor could not be read, so it was "
        f"not sent: {err.message}",
        request_id=request_id,
        code=err.code if isinstance(err, ProvidersError) and err.reason else reason.value,
        status=getattr(err, "status", None),
    )


def validate_token(token: str) -> str:
    if not isinstance(token, str) or not token or any(not 0x21 <= ord(c) <= 0x7E for c in token):
        # Never echo the token itself.
        raise ValueError("the token must be non-empty printable ASCII without spaces")
    return token

