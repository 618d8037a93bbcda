"""The digest encoding of docs/protocol.md: requests, results and records as frames and fields,
evidence as canonical JSON.

Every function here takes a value in its wire (JSON) shape, a ``dict`` as ``json.loads``
returns it, so that a digest is computed over exactly what crossed the wire. ``None`` and an
absent member are the same thing, as the protocol says.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import struct
from typing import Any, Callable, Mapping

REQUEST_DOMAIN = b"plimsoll/run-request/v1"
RESULT_DOMAIN = b"plimsoll/run-result/v1"
RECORD_DOMAIN = b"plimsoll/run-record/v1"

_BASE64 = re.compile(r"\A[A-Za-z0-9+/]*={0,2}\Z")


class EncodingError(ValueError):
    """A value cannot be encoded: it is not of the shape the protocol gives it."""


def _u64(n: Any) -> bytes:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 1 << 64:
        raise EncodingError(f"expected an unsigned 64-bit integer, got {n!r}")
    return struct.pack(">Q", n)


def _u16(n: Any) -> bytes:
    """A u16 (a port), widened to the 8 bytes of a u64."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 0xFFFF:
        raise EncodingError(f"expected an unsigned 16-bit integer, got {n!r}")
    return struct.pack(">Q", n)


def _i64(n: Any) -> bytes:
    if isinstance(n, bool) or not isinstance(n, int) or not -(1 << 63) <= n < 1 << 63:
        raise EncodingError(f"expected a signed 64-bit integer, got {n!r}")
    return struct.pack(">q", n)


def _f64(x: Any) -> bytes:
    """A JSON number as its IEEE 754 binary64 bits, big-endian (an integer is its binary64
    value first); NaN and the infinities are no number of the protocol's."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise EncodingError(f"expected a number, got {x!r}")
    try:
        value = float(x)
    except OverflowError:
        raise EncodingError(f"a number is out of the binary64 range: {x!r}") from None
    if not math.isfinite(value):
        raise EncodingError(f"expected a finite number, got {x!r}")
    return struct.pack(">d", value)


def _bool(b: Any) -> bytes:
    if not isinstance(b, bool):
        raise EncodingError(f"expected a boolean, got {b!r}")
    return b"\x01" if b else b"\x00"


def _str(s: Any) -> bytes:
    if not isinstance(s, str):
        raise EncodingError(f"expected a string, got {s!r}")
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as e:
        # A lone surrogate (JSON "\ud800") has no UTF-8 encoding to digest.
        raise EncodingError(f"a string is not valid Unicode ({e.reason})") from None


def decode_bytes(value: Any) -> bytes:
    """A wire byte string: a JSON string (its UTF-8) or ``{"base64": "..."}``, strictly."""
    if isinstance(value, str):
        return _str(value)
    if isinstance(value, Mapping):
        if set(value) != {"base64"} or not isinstance(value["base64"], str):
            raise EncodingError(
                'a byte string object must have exactly one member, "base64", a string'
            )
        text = value["base64"]
        if len(text) % 4 != 0 or not _BASE64.match(text):
            raise EncodingError("invalid base64 in a byte string (standard alphabet, padded)")
        try:
            raw = base64.b64decode(text, validate=True)
        except binascii.Error as e:
            raise EncodingError(f"invalid base64 in a byte string: {e}") from None
        # Unused trailing bits must be zero: only the canonical spelling is accepted.
        if base64.b64encode(raw).decode("ascii") != text:
            raise EncodingError("non-canonical base64 in a byte string (unused bits set)")
        return raw
    raise EncodingError(f"expected a byte string (a string or {{\"base64\": ...}}), got {value!r}")


def encode_bytes(raw: bytes) -> Any:
    """The wire form of bytes: a string when they are UTF-8, ``{"base64": ...}`` otherwise."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode("ascii")}


def _frame(x: bytes) -> bytes:
    return struct.pack(">Q", len(x)) + x


class _Fields:
    """Builds a nested encoding: ``frame(name) || frame(value)`` for each field, in order."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def add(self, name: str, value: bytes) -> None:
        self._parts.append(_frame(name.encode("ascii")) + _frame(value))

    def opt(self, obj: Mapping[str, Any], name: str, enc: Callable[[Any], bytes]) -> None:
        """A field left out when absent or null."""
        v = obj.get(name)
        if v is not None:
            self.add(name, enc(v))

    def req(self, obj: Mapping[str, Any], name: str, enc: Callable[[Any], bytes]) -> None:
        v = obj.get(name)
        if v is None:
            raise EncodingError(f"missing required member `{name}`")
        self.add(name, enc(v))

    def default(
        self, obj: Mapping[str, Any], name: str, enc: Callable[[Any], bytes], dflt: Any
    ) -> None:
        """A field with a default: never absent, the default is encoded."""
        v = obj.get(name)
        self.add(name, enc(dflt if v is None else v))

    def items(
        self, obj: Mapping[str, Any], name: str, enc: Callable[[Any], bytes]
    ) -> None:
        """A list: ``u64be(count) || frame(item)...``; absent, null and empty are left out."""
        v = obj.get(name)
        if v is None:
            return
        if not isinstance(v, list):
            raise EncodingError(f"`{name}` must be a list")
        if not v:
            return
        self.add(name, struct.pack(">Q", len(v)) + b"".join(_frame(enc(i)) for i in v))

    def nested(self) -> bytes:
        return b"".join(self._parts)

    def top(self, domain: bytes) -> bytes:
        return _frame(domain) + self.nested()


def _obj(v: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise EncodingError(f"{what} must be an object")
    return v


_TIERS = ("process", "container", "kernel", "vm")
_STARTS = ("warm", "cold")
_CREDENTIALS = ("static", "minted")
_END_REASONS = (
    "closed",
    "idle_timeout",
    "max_lifetime",
    "interpreter_crash",
    "out_of_memory",
    "cell_timeout",
    "sandbox_changed",
    "daemon_restarted",
    "sandbox_failed",
)


_SESSION_STARTS = ("restored", "forked")


_TRIAL_ENDS = (
    "completed",
    "failed",
    "controller_timeout",
    "controller_garbage",
    "controller_exited",
    "controller_flood",
)


def _tier(v: Any) -> bytes:
    if v not in _TIERS:
        raise EncodingError(f"unknown tier {v!r}")
    return _str(v)


def _start(v: Any) -> bytes:
    if v not in _STARTS:
        raise EncodingError(f"unknown start {v!r}")
    return _str(v)


def _credential(v: Any) -> bytes:
    if v not in _CREDENTIALS:
        raise EncodingError(f"unknown credential kind {v!r}")
    return _str(v)


def _end_reason(v: Any) -> bytes:
    if v not in _END_REASONS:
        raise EncodingError(f"unknown end reason {v!r}")
    return _str(v)


def _session_start(v: Any) -> bytes:
    if v not in _SESSION_STARTS:
        raise EncodingError(f"unknown session start {v!r}")
    return _str(v)


def _trial_end(v: Any) -> bytes:
    if v not in _TRIAL_ENDS:
        raise EncodingError(f"unknown trial end {v!r}")
    return _str(v)


def _limits(v: Any) -> bytes:
    o = _obj(v, "limits")
    f = _Fields()
    for name in (
        "timeout_ms",
        "memory_bytes",
        "output_bytes",
        "pids",
        "disk_bytes",
        "artifact_bytes",
    ):
        f.opt(o, name, _u64)
    return f.nested()


def _file(v: Any) -> bytes:
    o = _obj(v, "a file")
    f = _Fields()
    f.req(o, "path", _str)
    f.req(o, "content", decode_bytes)
    f.default(o, "executable", _bool, False)
    return f.nested()


def _step(v: Any) -> bytes:
    o = _obj(v, "a step")
    f = _Fields()
    f.opt(o, "name", _str)
    f.req(o, "run", _str)
    return f.nested()


def _run(v: Any) -> bytes:
    o = _obj(v, "run")
    f = _Fields()
    kind = o.get("kind")
    f.req(o, "kind", _str)
    if kind == "snippet":
        f.req(o, "language", _str)
        f.req(o, "code", _str)
    elif kind == "project":
        f.items(o, "files", _file)
        f.items(o, "steps", _step)
        f.items(o, "artifacts", _str)
    else:
        raise EncodingError(f"unknown run kind {kind!r}")
    return f.nested()


def request_encoding(request: Mapping[str, Any]) -> bytes:
    """The encoding of a run request (``request_id`` is not part of it)."""
    f = _Fields()
    f.req(request, "protocol", _u64)
    f.opt(request, "minimum_isolation", _tier)
    f.opt(request, "provider", _str)
    f.opt(request, "limits", _limits)
    f.req(request, "run", _run)
    f.opt(request, "grant", _str)
    # The image named (field 7), by name or identity as sent: left out when absent or null,
    # so every request that names none keeps its digest.
    f.opt(request, "image", _str)
    return f.top(REQUEST_DOMAIN)


def _outcome(f: _Fields, o: Mapping[str, Any]) -> None:
    """Fields 1 to 8 of a result, shared by a step result."""
    f.opt(o, "exit_code", _i64)
    f.opt(o, "signal", _i64)
    f.req(o, "timed_out", _bool)
    f.default(o, "oom_killed", _bool, False)
    f.req(o, "stdout", decode_bytes)
    f.req(o, "stdout_truncated", _bool)
    f.req(o, "stderr", decode_bytes)
    f.req(o, "stderr_truncated", _bool)


def _step_result(v: Any) -> bytes:
    o = _obj(v, "a step result")
    f = _Fields()
    f.opt(o, "name", _str)
    _outcome(f, o)
    return f.nested()


def _artifact(v: Any) -> bytes:
    o = _obj(v, "an artifact")
    f = _Fields()
    f.req(o, "path", _str)
    f.req(o, "found", _bool)
    f.req(o, "size", _u64)
    f.req(o, "content", decode_bytes)
    f.req(o, "truncated", _bool)
    return f.nested()


def _call(v: Any) -> bytes:
    o = _obj(v, "a grant call")
    f = _Fields()
    f.req(o, "method", _str)
    f.opt(o, "route", _str)
    f.opt(o, "status", _u64)
    f.opt(o, "error", _str)
    f.req(o, "request_bytes", _u64)
    f.req(o, "response_bytes", _u64)
    # Left out when absent or null, so a call listed before the member existed keeps its digest.
    f.opt(o, "credential", _credential)
    return f.nested()


def _namespace(v: Any) -> bytes:
    o = _obj(v, "a wall namespace")
    f = _Fields()
    f.req(o, "name", _str)
    f.req(o, "id", _str)
    f.opt(o, "same_as_host", _bool)
    return f.nested()


def _wall(v: Any) -> bytes:
    o = _obj(v, "the wall")
    f = _Fields()
    for name in ("uid", "euid", "gid"):
        f.req(o, name, _u64)
    f.items(o, "groups", _u64)
    for name in ("cap_inh", "cap_prm", "cap_eff", "cap_bnd", "cap_amb"):
        f.opt(o, name, _str)
    f.opt(o, "no_new_privs", _bool)
    f.opt(o, "seccomp", _u64)
    f.items(o, "namespaces", _namespace)
    f.req(o, "root_read_only", _bool)
    f.items(o, "network_interfaces", _str)
    f.opt(o, "memory_limit_bytes", _u64)
    f.opt(o, "pids_limit", _u64)
    return f.nested()


def _egress_receipt(v: Any) -> bytes:
    o = _obj(v, "an egress receipt")
    f = _Fields()
    f.req(o, "host", _str)
    f.req(o, "port", _u16)
    f.req(o, "kind", _str)
    f.opt(o, "address", _str)
    f.opt(o, "sni", _str)
    f.req(o, "bytes_up", _u64)
    f.req(o, "bytes_down", _u64)
    f.req(o, "start_ms", _u64)
    f.req(o, "end_ms", _u64)
    f.req(o, "verdict", _str)
    f.req(o, "rule", _str)
    f.opt(o, "ended", _str)
    return f.nested()


def result_encoding(result: Mapping[str, Any]) -> bytes:
    """The encoding of a run result (durations are not part of it)."""
    f = _Fields()
    _outcome(f, result)
    f.items(result, "steps", _step_result)
    f.items(result, "artifacts", _artifact)
    f.items(result, "calls", _call)
    # How the sandbox started, and a warm member's age: left out when absent or null, so a
    # result written before the members existed keeps its digest.
    f.opt(result, "start", _start)
    f.opt(result, "member_age_ms", _u64)
    # What the sandbox looked like before its code was handed over (field 14), likewise.
    f.opt(result, "wall", _wall)
    # A session's cell only (fields 15 and 16): left out when absent or null, so every result
    # outside sessions keeps its digest.
    f.opt(result, "state_kept", _bool)
    f.opt(result, "interpreter_end", _end_reason)
    # The egress receipts (field 17), every member covered, times included: left out when
    # empty, absent or null, so every result without receipts keeps its digest.
    f.items(result, "egress", _egress_receipt)
    return f.top(RESULT_DOMAIN)


def _image_ref(v: Any) -> bytes:
    o = _obj(v, "record.image")
    f = _Fields()
    f.req(o, "name", _str)
    f.req(o, "identity", _str)
    return f.nested()


def _simulator(v: Any) -> bytes:
    o = _obj(v, "a trial step's simulator")
    f = _Fields()
    f.req(o, "name", _str)
    f.req(o, "version", _str)
    f.req(o, "sha256", _str)
    return f.nested()


def _trial_outcome(v: Any) -> bytes:
    o = _obj(v, "a trial")
    f = _Fields()
    f.opt(o, "scenario", _str)
    f.req(o, "end", _trial_end)
    f.opt(o, "reason", _str)
    f.req(o, "ticks", _u64)
    f.opt(o, "score", _f64)
    f.req(o, "pass", _bool)
    f.req(o, "fingerprint", _str)
    return f.nested()


def _trial_step(v: Any) -> bytes:
    o = _obj(v, "a trial step")
    f = _Fields()
    f.req(o, "step", _u64)
    f.req(o, "simulator", _simulator)
    f.req(o, "pass", _bool)
    # Required, but a list: left out of the encoding when empty, as every list is.
    if o.get("trials") is None:
        raise EncodingError("missing required member `trials`")
    f.items(o, "trials", _trial_outcome)
    return f.nested()


def _origin(v: Any) -> bytes:
    o = _obj(v, "record.session.origin")
    f = _Fields()
    f.req(o, "start", _session_start)
    f.req(o, "snapshot_sha256", _str)
    f.req(o, "parent_session_id", _str)
    f.opt(o, "parent_record_sha256", _str)
    f.req(o, "parent_calls", _u64)
    return f.nested()


def record_encoding(record: Mapping[str, Any]) -> bytes:
    """The encoding of a run record (every member but ``record_sha256``)."""
    f = _Fields()
    f.req(record, "request_id", _str)
    f.req(record, "request_sha256", _str)
    f.req(record, "result_sha256", _str)
    f.req(record, "provider", _str)
    f.req(record, "isolation", _tier)
    # The applied floor, left out when absent or null: a record written before the member
    # existed keeps its digest.
    f.opt(record, "minimum_isolation", _tier)
    f.req(record, "evidence_sha256", _str)
    f.req(record, "environment", _str)
    f.req(record, "started_unix_ms", _u64)
    f.req(record, "ended_unix_ms", _u64)
    # A session call's link (field 11): its members as fields of the record itself, not
    # nested; absent or null adds nothing, so every record outside sessions keeps its digest.
    session = record.get("session")
    link: Mapping[str, Any] = {}
    if session is not None:
        link = _obj(session, "record.session")
        f.req(link, "session_id", _str)
        f.req(link, "sequence", _u64)
        f.opt(link, "previous_record_sha256", _str)
    # The image the code ran in (field 12), nested: left out when absent or null, so a record
    # of the process tier, or written before the member existed, keeps its digest.
    f.opt(record, "image", _image_ref)
    # What each trial step's verdict said (field 13), a list of nested: left out when empty,
    # absent or null, so a record of a run without trial steps keeps its digest.
    f.items(record, "trials", _trial_step)
    # Where a restored or forked session came from (field 14), nested, from the session's
    # link: left out when absent or null, so the records of a session opened fresh (and every
    # record outside sessions) keep their digests.
    f.opt(link, "origin", _origin)
    return f.top(RECORD_DOMAIN)


def _drop_nulls(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _drop_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_drop_nulls(x) for x in v]
    if isinstance(v, float):
        raise EncodingError("evidence holds no floats in protocol 1")
    return v


def evidence_canonical_json(evidence: Mapping[str, Any]) -> bytes:
    """Canonical JSON: no whitespace, members sorted by their names' UTF-8 bytes, nulls left
    out, minimal escapes, raw UTF-8."""

    def enc(v: Any) -> str:
        if isinstance(v, Mapping):
            members = sorted(v.items(), key=lambda kv: _str(kv[0]))
            return "{" + ",".join(enc(k) + ":" + enc(x) for k, x in members) + "}"
        if isinstance(v, list):
            return "[" + ",".join(enc(x) for x in v) + "]"
        if isinstance(v, str):
            _str(v)  # refuse lone surrogates
            return json.dumps(v, ensure_ascii=False)
        if v is True:
            return "true"
        if v is False:
            return "false"
        if isinstance(v, int):
            return str(v)
        raise EncodingError(f"evidence holds a value of no JSON type: {v!r}")

    return enc(_drop_nulls(evidence)).encode("utf-8")


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def request_sha256(request: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a request's encoding."""
    return _sha(request_encoding(request))


def result_sha256(result: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a result's encoding."""
    return _sha(result_encoding(result))


def record_sha256(record: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a record's encoding."""
    return _sha(record_encoding(record))


def evidence_sha256(evidence: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of evidence's canonical JSON."""
    return _sha(evidence_canonical_json(evidence))
