"""plimsoll: the official Python client of plimsolld.

    from plimsoll import Client
    with Client("http://127.0.0.1:7878", token) as c:
        res = c.run_python("print(6 * 7)", minimum_isolation="container")
        print(res.stdout.text(), res.isolation)
        with c.open_session("python", minimum_isolation="container") as s:
            s.cell("n = 6")
            print(s.cell("print(n * 7)").stdout.text())   # 42: the state is kept

Every result is verified before it is returned (request id echoed, tier at or above the
floor, the named provider, the request, result and record digests), and a session call's
record is checked against the session's chain. Every error is either
:class:`NotDispatched` (nothing ran; ``.reason``) or :class:`MayHaveRun` (never retry it
blindly); :func:`not_dispatched_reason` tells them apart.
"""

from ._digest import (
    evidence_canonical_json,
    evidence_sha256,
    record_encoding,
    record_sha256,
    request_encoding,
    request_sha256,
    result_encoding,
    result_sha256,
)
from ._types import (
    PROTOCOL,
    Artifact,
    EndReason,
    File,
    GrantCall,
    Limits,
    Output,
    OutputChunk,
    OutputStream,
    Project,
    ProviderInfo,
    ProvidersResponse,
    Reason,
    RunRecord,
    RunResponse,
    RunResult,
    RunSpec,
    SessionInfo,
    SessionLink,
    SessionList,
    Snippet,
    Start,
    Step,
    StepResult,
    Tier,
    Wall,
    WallNamespace,
)
from ._verify import DEFAULT_MAX_BODY_BYTES, new_request_id
from .client import AsyncClient, Client, __version__
from .session import AsyncSession, OnChunk, Session
from .errors import (
    BadResponse,
    ChainInDoubt,
    ChainMismatch,
    DaemonFailed,
    DigestMismatch,
    EvidenceMismatch,
    FileTruncated,
    InvalidRequest,
    MayHaveRun,
    NotDispatched,
    PlimsollError,
    ProviderMismatch,
    ProvidersError,
    RecordMismatch,
    RequestIdMismatch,
    RequestTooLarge,
    SessionsError,
    TransportError,
    Unreachable,
    UnverifiedRefusal,
    not_dispatched_reason,
)

__all__ = [
    "Artifact",
    "AsyncClient",
    "AsyncSession",
    "BadResponse",
    "ChainInDoubt",
    "ChainMismatch",
    "Client",
    "DaemonFailed",
    "DEFAULT_MAX_BODY_BYTES",
    "DigestMismatch",
    "EndReason",
    "evidence_canonical_json",
    "evidence_sha256",
    "EvidenceMismatch",
    "File",
    "FileTruncated",
    "GrantCall",
    "InvalidRequest",
    "Limits",
    "MayHaveRun",
    "new_request_id",
    "not_dispatched_reason",
    "NotDispatched",
    "OnChunk",
    "Output",
    "OutputChunk",
    "OutputStream",
    "PlimsollError",
    "Project",
    "PROTOCOL",
    "ProviderInfo",
    "ProviderMismatch",
    "ProvidersError",
    "ProvidersResponse",
    "Reason",
    "record_encoding",
    "record_sha256",
    "RecordMismatch",
    "request_encoding",
    "request_sha256",
    "RequestIdMismatch",
    "RequestTooLarge",
    "result_encoding",
    "result_sha256",
    "RunRecord",
    "RunResponse",
    "RunResult",
    "RunSpec",
    "Session",
    "SessionInfo",
    "SessionLink",
    "SessionList",
    "SessionsError",
    "Snippet",
    "Start",
    "Step",
    "StepResult",
    "Tier",
    "TransportError",
    "Unreachable",
    "UnverifiedRefusal",
    "Wall",
    "WallNamespace",
    "__version__",
]
