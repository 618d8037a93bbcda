"""plimsoll: the official Python client of plimsolld.

    from plimsoll import Client
    with Client("http://127.0.0.1:7878", token) as c:
        res = c.run_python("print(6 * 7)", minimum_isolation="container")
        print(res.stdout.text(), res.isolation)

Every result is verified before it is returned (request id echoed, tier at or above the
floor, the named provider, the request, result and record digests). Every error is either
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
    File,
    GrantCall,
    Limits,
    Output,
    Project,
    ProviderInfo,
    ProvidersResponse,
    Reason,
    RunRecord,
    RunResponse,
    RunResult,
    RunSpec,
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
from .errors import (
    BadResponse,
    DaemonFailed,
    DigestMismatch,
    EvidenceMismatch,
    InvalidRequest,
    MayHaveRun,
    NotDispatched,
    PlimsollError,
    ProviderMismatch,
    ProvidersError,
    RecordMismatch,
    RequestIdMismatch,
    RequestTooLarge,
    TransportError,
    Unreachable,
    UnverifiedRefusal,
    not_dispatched_reason,
)

__all__ = [
    "AsyncClient",
    "Artifact",
    "BadResponse",
    "Client",
    "DaemonFailed",
    "DEFAULT_MAX_BODY_BYTES",
    "DigestMismatch",
    "EvidenceMismatch",
    "File",
    "GrantCall",
    "InvalidRequest",
    "Limits",
    "MayHaveRun",
    "NotDispatched",
    "Output",
    "PROTOCOL",
    "PlimsollError",
    "Project",
    "ProviderInfo",
    "ProviderMismatch",
    "ProvidersError",
    "ProvidersResponse",
    "Reason",
    "RecordMismatch",
    "RequestIdMismatch",
    "RequestTooLarge",
    "RunRecord",
    "RunResponse",
    "RunResult",
    "RunSpec",
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
    "evidence_canonical_json",
    "evidence_sha256",
    "new_request_id",
    "not_dispatched_reason",
    "record_encoding",
    "record_sha256",
    "request_encoding",
    "request_sha256",
    "result_encoding",
    "result_sha256",
]
