"""The client's errors. Every error of a run is exactly one of two kinds:

- :class:`NotDispatched`: certainly nothing ran (``.reason`` says why); retrying may help for
  ``capacity``;
- :class:`MayHaveRun`: the code may have run (or did run, below what was asked): never retry
  it automatically, a retry may run the code twice.

:func:`not_dispatched_reason` answers "did nothing run?" for any exception.
"""

from __future__ import annotations

from typing import Any, Optional

from ._types import EndReason, ImageRef, Reason, Tier


class PlimsollError(Exception):
    """Base of every error this client raises.

    ``request_id`` is the id this client sent (or would have sent); ``code`` a stable
    machine-readable code; ``end_reason``, for a session that has ended, why it ended
    (``None`` otherwise).
    """

    code: str = "error"
    end_reason: Optional[EndReason] = None
    close_error: Optional[BaseException] = None
    """When this client closed a session after this error (one opened below the floor, say)
    and the close failed too: why. Both errors are kept."""

    def __init__(self, message: str, *, request_id: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id

    @property
    def not_dispatched(self) -> Optional[Reason]:
        """The reason nothing ran, or ``None`` when the code may have run."""
        return None


class NotDispatched(PlimsollError):
    """Nothing ran: the daemon refused the request and its answer echoed this request's id,
    or this client refused to send it (:class:`InvalidRequest`, :class:`RequestTooLarge`), or
    the daemon could not be reached (:class:`Unreachable`).

    A session call's refusal has a code of its own (``session_not_found``,
    ``session_ended``, ``interpreter_ended``, ``sandbox_changed``) and, when the session has
    ended, ``end_reason``."""

    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        request_id: Optional[str] = None,
        code: Optional[str] = None,
        status: Optional[int] = None,
        end_reason: Optional[EndReason] = None,
    ) -> None:
        ended = f" (the session ended: {end_reason})" if end_reason is not None else ""
        super().__init__(f"not dispatched ({reason}): {message}{ended}", request_id=request_id)
        self.reason = reason
        self.detail = message
        self.code = code or reason.value
        self.status = status
        self.end_reason = end_reason

    @property
    def not_dispatched(self) -> Optional[Reason]:
        return self.reason


class InvalidRequest(NotDispatched):
    """The request is malformed; this client did not send it."""

    def __init__(self, message: str, *, request_id: Optional[str] = None) -> None:
        super().__init__(Reason.REQUEST, message, request_id=request_id)


class RequestTooLarge(InvalidRequest):
    """The request body is over this client's limit (by default the daemon's default
    ``max_body_bytes``, 8 MiB); it was not sent. Not dispatched, reason ``request``: the
    daemon would refuse it the same way, but its refusal might arrive only as a closed
    connection, which reads "may have run"."""

    def __init__(self, size: int, limit: int, *, request_id: Optional[str] = None) -> None:
        super().__init__(
            f"the request is {size} bytes, over this client's limit of {limit} bytes "
            "(the daemon's max_body_bytes): send less, or pass max_body_bytes= to match the "
            "daemon's",
            request_id=request_id,
        )
        self.size = size
        self.limit = limit


class Unreachable(NotDispatched):
    """The daemon could not be reached and nothing was sent (connection refused, name not
    resolved, connect timeout, bad URL)."""

    def __init__(self, url: str, message: str, *, request_id: Optional[str] = None) -> None:
        super().__init__(
            Reason.ENVIRONMENT,
            f"cannot reach the daemon at {url} ({message}): check that plimsolld is "
            "running and the URL is right",
            request_id=request_id,
        )
        self.url = url


class MayHaveRun(PlimsollError):
    """The code may have run: the daemon failed after it may have started, the exchange broke
    after the request may have left, or the answer is not this request's or does not verify.
    Never retried automatically."""

    code = "may_have_run"

    def __init__(
        self,
        message: str,
        *,
        request_id: Optional[str] = None,
        code: Optional[str] = None,
        status: Optional[int] = None,
    ) -> None:
        super().__init__(message, request_id=request_id)
        if code is not None:
            self.code = code
        self.status = status


class DaemonFailed(MayHaveRun):
    """The daemon answered an error without the not-dispatched mark (e.g. ``sandbox_failed``,
    after which a session has ended)."""

    def __init__(
        self,
        message: str,
        *,
        request_id: str,
        code: str,
        status: int,
        end_reason: Optional[EndReason] = None,
    ) -> None:
        super().__init__(
            f"the code may have run (request {request_id}, HTTP {status}, {code}): {message}; "
            "do not retry blindly",
            request_id=request_id,
            code=code,
            status=status,
        )
        self.detail = message
        self.end_reason = end_reason


class UnverifiedRefusal(MayHaveRun):
    """An answer claimed nothing ran, but echoed another request's id (or none): the claim
    cannot be about this request."""

    code = "unverified_refusal"

    def __init__(
        self, *, sent: str, echoed: Optional[str], reason: Reason, message: str, status: int
    ) -> None:
        super().__init__(
            f"the code may have run: an answer claimed `not dispatched ({reason})` but echoed "
            f"request id {echoed if echoed is not None else '(none)'}, not {sent}; something "
            "between this client and the daemon mixed up answers",
            request_id=sent,
            status=status,
        )
        self.echoed = echoed
        self.claimed_reason = reason
        self.detail = message


class RequestIdMismatch(MayHaveRun):
    """A result echoed another request's id: it is not this request's result."""

    code = "request_id_mismatch"

    def __init__(self, *, sent: str, echoed: str) -> None:
        super().__init__(
            f"the code may have run: the result echoes request id {echoed}, not {sent}; "
            "something between this client and the daemon mixed up answers, so this result "
            "is not yours",
            request_id=sent,
            status=200,
        )
        self.echoed = echoed


class TransportError(MayHaveRun):
    """The exchange failed after the request may have been sent."""

    code = "transport"

    def __init__(self, url: str, message: str, *, request_id: str) -> None:
        super().__init__(
            f"the code may have run: the exchange with {url} failed after the request may "
            f"have been sent (request {request_id}): {message}",
            request_id=request_id,
        )
        self.url = url


class BadResponse(MayHaveRun):
    """The answer could not be read as a result or an error."""

    code = "bad_response"

    def __init__(self, message: str, *, request_id: Optional[str], status: int) -> None:
        super().__init__(
            f"the code may have run: unreadable answer from the daemon (request "
            f"{request_id}, HTTP {status}): {message}",
            request_id=request_id,
            status=status,
        )


class DigestMismatch(MayHaveRun):
    """A digest recomputed here differs from the one in the answer. ``kind`` is ``"request"``,
    ``"result"`` or ``"record"`` (or ``"evidence"`` for a providers listing)."""

    code = "digest_mismatch"

    def __init__(
        self, *, kind: str, computed: str, claimed: str, request_id: Optional[str]
    ) -> None:
        super().__init__(
            f"{kind} digest mismatch for request {request_id}: computed {computed}, the "
            "answer says "
            f"{claimed}; the answer was altered on the way or the daemon is faulty, and the "
            "code may have run",
            request_id=request_id,
            status=200,
        )
        self.kind = kind
        self.computed = computed
        self.claimed = claimed


class RecordMismatch(MayHaveRun):
    """The run record disagrees with the response around it, or (``field`` is
    ``"minimum_isolation"``) states another applied floor than the one the run was sent with:
    ``response`` then holds the floor sent, or the daemon's default floor when none was."""

    code = "record_mismatch"

    def __init__(
        self,
        *,
        field: str,
        response: str,
        record: str,
        request_id: str,
        against: str = "the response",
        subject: str = "the run record",
    ) -> None:
        super().__init__(
            f"{subject} disagrees with {against} on `{field}` for request "
            f"{request_id}: {against} {response}, {subject} {record}; the answer was altered "
            "or the daemon is faulty, and the code may have run",
            request_id=request_id,
            status=200,
        )
        self.field = field
        self.response = response
        self.record = record


class EvidenceMismatch(MayHaveRun):
    """The result says the run used a tier below the floor (the one sent, or the daemon's
    default floor when none was sent, or the floor the record says the daemon applied). The
    code ran: this is not a refusal."""

    code = "evidence_mismatch"

    def __init__(
        self,
        *,
        request_id: str,
        provider: str,
        isolation: Tier,
        floor: Tier,
        default: bool,
        applied: bool = False,
        which: Optional[str] = None,
        subject: str = "the run",
        outcome: str = "the code ran, but not behind the wall you required",
    ) -> None:
        if which is not None:
            which = f"{which} `{floor}`"
        elif applied:
            which = f"the floor `{floor}` its record says the daemon applied"
        elif default:
            which = f"the daemon's default floor `{floor}`"
        else:
            which = f"the floor `{floor}` asked for"
        super().__init__(
            f"evidence mismatch for request {request_id}: {subject} used `{isolation}` "
            f"(provider {provider}), below {which}; {outcome}",
            request_id=request_id,
            status=200,
        )
        self.provider = provider
        self.isolation = isolation
        self.floor = floor


class ProviderMismatch(MayHaveRun):
    """The result names another provider than the one the request named. The code ran."""

    code = "evidence_mismatch"

    def __init__(
        self,
        *,
        request_id: str,
        asked: str,
        provider: str,
        subject: str = "the run",
        outcome: str = "the code ran, but not where you required",
    ) -> None:
        super().__init__(
            f"evidence mismatch for request {request_id}: {subject} used provider "
            f"`{provider}`, not `{asked}` as asked; {outcome}",
            request_id=request_id,
            status=200,
        )
        self.asked = asked
        self.provider = provider


class ImageMismatch(MayHaveRun):
    """The request (or the session's open) named an image, and the answer's record (or the
    session) names none, or another one: ``image`` is what it names (``None``: nothing). A
    request is never served by another image than the one it named (docs/protocol.md). The
    code ran: this is not a refusal."""

    code = "evidence_mismatch"

    def __init__(
        self,
        *,
        request_id: str,
        asked: str,
        image: Optional[ImageRef],
        subject: str = "the run",
        outcome: str = "the code ran, but not in the image you named",
    ) -> None:
        ran = (
            f"ran in image `{image.name}` ({image.identity})"
            if image is not None
            else "names no image (no `image` member)"
        )
        super().__init__(
            f"evidence mismatch for request {request_id}: {subject} {ran}, not the image "
            f"`{asked}` asked for; {outcome}",
            request_id=request_id,
            status=200,
        )
        self.asked = asked
        self.image = image


class ChainMismatch(MayHaveRun):
    """A session call's answer verified as a run, but does not follow the session's chain
    (docs/sessions.md, "Chained records"): its record names another session, or another
    origin than the session's (``origin``: a restored or forked session's every record
    carries its own, a fresh session's none), or is not the call after the last one this
    client saw (``sequence``, ``previous_record_sha256``: a call missing, repeated or
    reordered, or another call's answer replayed), or ran elsewhere than the session
    (``provider``, ``isolation``, ``evidence_sha256``, ``environment``). The call may have
    run.

    Also a snapshot that is not of the session where its chain stands (``snapshot.session_id``,
    ``snapshot.calls``...), or a fork's copy or a session opened from a snapshot that does not
    hang from it (``origin``, ``origin.start``, ``origin.parent_session_id``,
    ``origin.snapshot_sha256``, ``origin.parent_calls``, ``origin.parent_record_sha256``) or
    whose chain does not start there (``calls``, ``last_record_sha256``); such a session is
    closed again."""

    code = "chain_mismatch"

    def __init__(
        self,
        *,
        session_id: str,
        request_id: str,
        field: str,
        expected: str,
        got: str,
        why: str,
    ) -> None:
        super().__init__(
            f"session {session_id}: the answer to request {request_id} does not follow the "
            f"session's chain: `{field}` is {got}, not {expected} ({why}); the answer was "
            "altered or replayed, or the daemon is faulty, and the call may have run",
            request_id=request_id,
            status=200,
        )
        self.session_id = session_id
        self.field = field
        self.expected = expected
        self.got = got


class FileTruncated(MayHaveRun):
    """A session's file came back cut at the artifact limit: the call ran and verified (it is
    in the session's chain, ``response`` holds it), but these are not the file's bytes."""

    code = "file_truncated"

    def __init__(self, *, path: str, size: int, kept: int, response: Any) -> None:
        super().__init__(
            f"the file `{path}` is {size} bytes, and only its first {kept} came back (the "
            "session's artifact limit): open the session with a larger limits.artifact_bytes, "
            "or read the file in parts with steps",
            request_id=response.request_id,
            status=200,
        )
        self.path = path
        self.size = size
        self.kept = kept
        self.response = response


class ChainInDoubt(NotDispatched):
    """A session call was not sent: an earlier call of this session may have run without an
    answer this client could verify, so where the session's chain stands is unknown here.
    ``Session.resync()`` takes the daemon's word for it (or open a new session)."""

    def __init__(self, *, session_id: str, request_id: str, earlier: str) -> None:
        super().__init__(
            Reason.REQUEST,
            f"session {session_id}: request {earlier} may have run without a verified answer, "
            "so this client no longer knows where the session's chain stands and did not "
            "send this call; call resync() to take the daemon's word for it, or open a new "
            "session",
            request_id=request_id,
            code="chain_in_doubt",
        )
        self.session_id = session_id
        self.earlier = earlier


class SessionsError(PlimsollError):
    """``GET /v1/sessions``, ``GET /v1/sessions/{id}`` or ``GET /v1/snapshots`` gave no usable
    answer (they run nothing, so they carry no mark): ``code`` is the daemon's
    (``session_not_found``, ``session_ended``...) when it answered one, ``end_reason`` why the
    session ended."""

    code = "sessions"

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        reason: Optional[Reason] = None,
        end_reason: Optional[EndReason] = None,
        session_id: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        if code is not None:
            self.code = code
        self.reason = reason
        self.end_reason = end_reason
        self.session_id = session_id


class ProvidersError(PlimsollError):
    """``GET /v1/providers`` gave no usable answer (it runs nothing, so it has no mark)."""

    code = "providers"

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        reason: Optional[Reason] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        if code is not None:
            self.code = code
        # The mark the daemon's error answer carried, if any (used when a run that needs the
        # default floor could not learn it: then that run was not sent).
        self.reason = reason


def not_dispatched_reason(err: BaseException) -> Optional[Reason]:
    """Why nothing ran, when ``err`` promises that nothing did; ``None`` otherwise (the code
    may have run, or ``err`` is not this client's)."""
    if isinstance(err, PlimsollError):
        return err.not_dispatched
    return None
