"""The protocol's values as Python types: tiers, reasons, what to run, and the typed results
read (strictly) from the daemon's answers."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

from ._digest import EncodingError, decode_bytes, encode_bytes

PROTOCOL = 1
"""The protocol number this client speaks."""


class Tier(str, enum.Enum):
    """An isolation tier, ordered weakest first: ``process < container < kernel < vm``."""

    PROCESS = "process"
    CONTAINER = "container"
    KERNEL = "kernel"
    VM = "vm"

    @property
    def rank(self) -> int:
        """0 for ``process`` up to 3 for ``vm``."""
        return _TIER_ORDER.index(self)

    # str's own comparisons would order tiers alphabetically: compare by rank, also against
    # a tier's name (an unknown name raises ValueError rather than comparing as text).
    def _other(self, other: object) -> int:
        if isinstance(other, Tier):
            return other.rank
        if isinstance(other, str):
            return as_tier(other).rank
        return NotImplemented  # type: ignore[return-value]

    def __lt__(self, other: object) -> bool:
        o = self._other(other)
        return NotImplemented if o is NotImplemented else self.rank < o

    def __le__(self, other: object) -> bool:
        o = self._other(other)
        return NotImplemented if o is NotImplemented else self.rank <= o

    def __gt__(self, other: object) -> bool:
        o = self._other(other)
        return NotImplemented if o is NotImplemented else self.rank > o

    def __ge__(self, other: object) -> bool:
        o = self._other(other)
        return NotImplemented if o is NotImplemented else self.rank >= o

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value


_TIER_ORDER = (Tier.PROCESS, Tier.CONTAINER, Tier.KERNEL, Tier.VM)


class Start(str, enum.Enum):
    """How a run's sandbox started: ``warm``, a fresh sandbox started ahead of the request
    and used for exactly one run, or ``cold``, one started for the request."""

    WARM = "warm"
    COLD = "cold"

    def __str__(self) -> str:
        return self.value


class CredentialKind(str, enum.Enum):
    """Which kind of credential the broker attached to a grant's call: ``static``, the
    profile's static secret (development only, the same on every call of every run), or
    ``minted``, a short-lived JWT minted for the run."""

    STATIC = "static"
    MINTED = "minted"

    def __str__(self) -> str:
        return self.value


class EndReason(str, enum.Enum):
    """Why a session, or its interpreter, ended (docs/sessions.md, "Ends"). Every end has one;
    none is silent. ``interpreter_crash``, ``out_of_memory`` and ``cell_timeout`` end only the
    interpreter (its state); the others end the session."""

    CLOSED = "closed"
    IDLE_TIMEOUT = "idle_timeout"
    MAX_LIFETIME = "max_lifetime"
    INTERPRETER_CRASH = "interpreter_crash"
    OUT_OF_MEMORY = "out_of_memory"
    CELL_TIMEOUT = "cell_timeout"
    SANDBOX_CHANGED = "sandbox_changed"
    DAEMON_RESTARTED = "daemon_restarted"
    SANDBOX_FAILED = "sandbox_failed"

    @property
    def ends_interpreter_only(self) -> bool:
        """Whether this ends only the interpreter (its state), not the session."""
        return self in (
            EndReason.INTERPRETER_CRASH,
            EndReason.OUT_OF_MEMORY,
            EndReason.CELL_TIMEOUT,
        )

    def __str__(self) -> str:
        return self.value


class SessionStart(str, enum.Enum):
    """How a session that did not open fresh began: ``restored``, opened from a snapshot
    (:meth:`Client.open_snapshot`), or ``forked``, one copy of a fork (:meth:`Session.fork`)."""

    RESTORED = "restored"
    FORKED = "forked"

    def __str__(self) -> str:
        return self.value


class TrialEnd(str, enum.Enum):
    """How a trial ended (a trial step's verdict, docs/trials.md): ``completed`` or ``failed``
    by the simulator, or one of the controller's faults, after which the trial never passes."""

    COMPLETED = "completed"
    FAILED = "failed"
    CONTROLLER_TIMEOUT = "controller_timeout"
    CONTROLLER_GARBAGE = "controller_garbage"
    CONTROLLER_EXITED = "controller_exited"
    CONTROLLER_FLOOD = "controller_flood"

    @property
    def is_controller_fault(self) -> bool:
        """Whether the controller caused this end (a timeout, garbage, an exit, a flood)."""
        return self not in (TrialEnd.COMPLETED, TrialEnd.FAILED)

    def __str__(self) -> str:
        return self.value


class Reason(str, enum.Enum):
    """Why nothing ran: the reason of a "not dispatched" mark."""

    REQUEST = "request"
    PERMISSION = "permission"
    PROTOCOL = "protocol"
    UNSUPPORTED = "unsupported"
    ISOLATION = "isolation"
    ENVIRONMENT = "environment"
    CAPACITY = "capacity"

    def __str__(self) -> str:
        return self.value


TierLike = Union[Tier, str]


def as_tier(value: TierLike) -> Tier:
    """A tier from a :class:`Tier` or its name; a clear ``ValueError`` otherwise."""
    try:
        return Tier(value)
    except ValueError:
        raise ValueError(
            f"unknown tier {value!r}: use one of process, container, kernel, vm"
        ) from None


IMAGE_NAME_MAX = 64
"""The longest image name."""

_IMAGE_NAME_FIRST = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_IMAGE_NAME_REST = _IMAGE_NAME_FIRST | frozenset("._-")


def is_image_name(value: Any) -> bool:
    """Whether ``value`` is an image name: 1 to 64 characters of ``a-z 0-9 . _ -``, the first a
    letter or a digit. A name never holds ``:``, so a selector with one is an identity."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= IMAGE_NAME_MAX
        and value[0] in _IMAGE_NAME_FIRST
        and all(c in _IMAGE_NAME_REST for c in value[1:])
    )


def is_image_identity(value: Any) -> bool:
    """Whether ``value`` is an image identity: ``sha256:`` and 64 lowercase hex digits."""
    return (
        isinstance(value, str)
        and value.startswith("sha256:")
        and len(value) == 7 + 64
        and all(c in "0123456789abcdef" for c in value[7:])
    )


def check_image_selector(value: Any) -> str:
    """``value`` when it names an image (a name or an identity); a ``ValueError`` saying what
    one is otherwise."""
    if isinstance(value, str) and (is_image_name(value) or is_image_identity(value)):
        return value
    raise ValueError(
        f"image {value!r} is neither an image name (1 to {IMAGE_NAME_MAX} characters of "
        "a-z 0-9 . _ -, starting with a letter or digit) nor an identity (sha256: and 64 "
        "lowercase hex characters): providers().images lists the daemon's images"
    )


class Output(bytes):
    """Exact bytes (program output, a file, an artifact), which need not be UTF-8."""

    def text(self, errors: str = "replace") -> str:
        """The bytes decoded as UTF-8; invalid sequences become U+FFFD unless ``errors`` says
        otherwise (``"strict"`` raises)."""
        return self.decode("utf-8", errors)


# --- what to run -----------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Limits to ask for; each ``None`` takes the operator's default. Every one must be > 0."""

    timeout_ms: Optional[int] = None
    memory_bytes: Optional[int] = None
    output_bytes: Optional[int] = None
    pids: Optional[int] = None
    disk_bytes: Optional[int] = None
    artifact_bytes: Optional[int] = None

    def to_wire(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Snippet:
    """A piece of code in one language: ``javascript`` (node) or ``python`` (python3)."""

    language: str
    code: str

    def to_wire(self) -> dict[str, Any]:
        return {"kind": "snippet", "language": self.language, "code": self.code}


@dataclass(frozen=True)
class File:
    """A project file written under ``/work`` before the first step."""

    path: str
    content: Union[bytes, str]
    executable: bool = False

    def to_wire(self) -> dict[str, Any]:
        raw = self.content.encode("utf-8") if isinstance(self.content, str) else self.content
        out: dict[str, Any] = {"path": self.path, "content": encode_bytes(bytes(raw))}
        if self.executable:
            out["executable"] = True
        return out


@dataclass(frozen=True)
class Step:
    """A shell step, run by ``/bin/sh -c`` in ``/work``; ``name`` is a label for people."""

    run: str
    name: Optional[str] = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.name is not None:
            out["name"] = self.name
        out["run"] = self.run
        return out


@dataclass(frozen=True)
class Project:
    """Files, shell steps run in order (the first that fails stops the run), artifacts."""

    steps: Sequence[Union[Step, str]]
    files: Sequence[File] = ()
    artifacts: Sequence[str] = ()

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "project"}
        if self.files:
            out["files"] = [f.to_wire() for f in self.files]
        out["steps"] = [(Step(s) if isinstance(s, str) else s).to_wire() for s in self.steps]
        if self.artifacts:
            out["artifacts"] = list(self.artifacts)
        return out


RunSpec = Union[Snippet, Project]


# --- strict reading of answers ---------------------------------------------------------


class WireError(ValueError):
    """An answer does not have the shape the protocol gives it."""


def _check_members(
    o: Any, what: str, required: Sequence[str], optional: Sequence[str] = ()
) -> Mapping[str, Any]:
    if not isinstance(o, Mapping):
        raise WireError(f"{what} is not an object")
    unknown = set(o) - set(required) - set(optional)
    if unknown:
        raise WireError(f"{what} has unknown members: {', '.join(sorted(unknown))}")
    for name in required:
        if o.get(name) is None:
            raise WireError(f"{what} lacks `{name}`")
    return o


def _int(o: Mapping[str, Any], name: str, what: str, lo: int, hi: int) -> Optional[int]:
    v = o.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise WireError(f"{what}.{name} is not an integer in range: {v!r}")
    return v


def _u64(o: Mapping[str, Any], name: str, what: str) -> Optional[int]:
    return _int(o, name, what, 0, (1 << 64) - 1)


def _i32(o: Mapping[str, Any], name: str, what: str) -> Optional[int]:
    return _int(o, name, what, -(1 << 31), (1 << 31) - 1)


def _bool(o: Mapping[str, Any], name: str, what: str, default: Optional[bool] = None) -> bool:
    v = o.get(name)
    if v is None and default is not None:
        return default
    if not isinstance(v, bool):
        raise WireError(f"{what}.{name} is not a boolean: {v!r}")
    return v


def _str(o: Mapping[str, Any], name: str, what: str) -> Optional[str]:
    v = o.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise WireError(f"{what}.{name} is not a string: {v!r}")
    return v


def _bytes(o: Mapping[str, Any], name: str, what: str) -> Output:
    try:
        return Output(decode_bytes(o.get(name)))
    except EncodingError as e:
        raise WireError(f"{what}.{name}: {e}") from None


def _tier(o: Mapping[str, Any], name: str, what: str) -> Tier:
    v = o.get(name)
    try:
        return Tier(v)
    except ValueError:
        raise WireError(f"{what}.{name} is not a tier: {v!r}") from None


def _end_reason(o: Mapping[str, Any], name: str, what: str) -> Optional[EndReason]:
    v = o.get(name)
    if v is None:
        return None
    try:
        return EndReason(v)
    except ValueError:
        raise WireError(f"{what}.{name} is not an end reason: {v!r}") from None


def _list(o: Mapping[str, Any], name: str, what: str) -> list[Any]:
    v = o.get(name)
    if v is None:
        return []
    if not isinstance(v, list):
        raise WireError(f"{what}.{name} is not a list")
    return v


def _f64(o: Mapping[str, Any], name: str, what: str) -> Optional[float]:
    """A JSON number (an integer is one too) as a float; finite only."""
    v = o.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WireError(f"{what}.{name} is not a number: {v!r}")
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise WireError(f"{what}.{name} is not a finite number: {v!r}")
    return f


def _digest(o: Mapping[str, Any], name: str, what: str) -> str:
    v = _str(o, name, what)
    if v is None or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise WireError(f"{what}.{name} is not 64 lowercase hex digits: {v!r}")
    return v


_OUTCOME_REQUIRED = ("timed_out", "stdout", "stdout_truncated", "stderr", "stderr_truncated")
_OUTCOME_OPTIONAL = ("exit_code", "signal", "oom_killed")


@dataclass(frozen=True)
class StepResult:
    """One project step that ran."""

    name: Optional[str]
    exit_code: Optional[int]
    signal: Optional[int]
    timed_out: bool
    oom_killed: bool
    stdout: Output
    stdout_truncated: bool
    stderr: Output
    stderr_truncated: bool
    duration_ms: int

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "StepResult":
        o = _check_members(
            o, what, _OUTCOME_REQUIRED + ("duration_ms",), _OUTCOME_OPTIONAL + ("name",)
        )
        return cls(
            name=_str(o, "name", what),
            exit_code=_i32(o, "exit_code", what),
            signal=_i32(o, "signal", what),
            timed_out=_bool(o, "timed_out", what),
            oom_killed=_bool(o, "oom_killed", what, False),
            stdout=_bytes(o, "stdout", what),
            stdout_truncated=_bool(o, "stdout_truncated", what),
            stderr=_bytes(o, "stderr", what),
            stderr_truncated=_bool(o, "stderr_truncated", what),
            duration_ms=_u64(o, "duration_ms", what) or 0,
        )


@dataclass(frozen=True)
class Artifact:
    """A file a project asked back; ``found`` is false when it was missing or not regular."""

    path: str
    found: bool
    size: int
    content: Output
    truncated: bool

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "Artifact":
        o = _check_members(o, what, ("path", "found", "size", "content", "truncated"))
        return cls(
            path=_str(o, "path", what) or "",
            found=_bool(o, "found", what),
            size=_u64(o, "size", what) or 0,
            content=_bytes(o, "content", what),
            truncated=_bool(o, "truncated", what),
        )


@dataclass(frozen=True)
class GrantCall:
    """One call the run made through its grant's broker (never the credential or a body)."""

    method: str
    route: Optional[str]
    status: Optional[int]
    error: Optional[str]
    request_bytes: int
    response_bytes: int
    latency_ms: int
    credential: Optional[CredentialKind] = None
    """The kind of credential the broker attached. Read as optional so an older result
    parses; the daemon sets it on every call it lists. Inside the result digest."""

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "GrantCall":
        o = _check_members(
            o,
            what,
            ("method", "request_bytes", "response_bytes", "latency_ms"),
            ("route", "status", "error", "credential"),
        )
        credential = o.get("credential")
        if credential is not None:
            try:
                credential = CredentialKind(credential)
            except ValueError:
                raise WireError(
                    f"{what}.credential is not static or minted: {credential!r}"
                ) from None
        return cls(
            method=_str(o, "method", what) or "",
            route=_str(o, "route", what),
            status=_int(o, "status", what, 0, 65535),
            error=_str(o, "error", what),
            request_bytes=_u64(o, "request_bytes", what) or 0,
            response_bytes=_u64(o, "response_bytes", what) or 0,
            latency_ms=_u64(o, "latency_ms", what) or 0,
            credential=credential,
        )


@dataclass(frozen=True)
class EgressReceipt:
    """One connection the run's code asked the broker for through its egress proxy, allowed
    or refused (docs/protocol.md, EgressReceipt). Every member is inside the result digest,
    the times included. ``kind``, ``verdict``, ``rule`` and ``ended`` are read as the strings
    sent, so a value a later daemon adds still parses."""

    host: str
    """The host the code named (lowercased), or the IP literal or the target as sent (at
    most 255 bytes) when it was refused before it parsed."""
    port: int
    """The port the code named; 0 when it named none that parsed."""
    kind: str
    """``connect`` (a CONNECT tunnel) or ``http`` (one plain-HTTP request)."""
    address: Optional[str]
    """The address the broker connected to, ``ip:port`` (``[v6]:port``); ``None`` when it
    connected to none."""
    sni: Optional[str]
    """The server name the TLS ClientHello carried; ``None`` for plain HTTP or when none was
    read."""
    bytes_up: int
    """Bytes from the code to the host."""
    bytes_down: int
    """Bytes from the host to the code."""
    start_ms: int
    """When the broker accepted the request, in milliseconds from the run's start."""
    end_ms: int
    """When the connection ended, in milliseconds from the run's start."""
    verdict: str
    """``allowed`` or ``refused``."""
    rule: str
    """For ``allowed``, the rule that allowed it (``host *.example.com port 443``, with
    `` via <range>`` when an address range let a non-public address through); for
    ``refused``, the check's code (``host_not_allowed``, ``ip_literal``, ...)."""
    ended: Optional[str]
    """How an allowed connection ended (``closed``, ``deadline``, ``budget_bytes``, ...);
    ``None`` for a refused one."""

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "EgressReceipt":
        o = _check_members(
            o,
            what,
            (
                "host",
                "port",
                "kind",
                "bytes_up",
                "bytes_down",
                "start_ms",
                "end_ms",
                "verdict",
                "rule",
            ),
            ("address", "sni", "ended"),
        )
        return cls(
            host=_str(o, "host", what) or "",
            port=_int(o, "port", what, 0, 65535) or 0,
            kind=_str(o, "kind", what) or "",
            address=_str(o, "address", what),
            sni=_str(o, "sni", what),
            bytes_up=_u64(o, "bytes_up", what) or 0,
            bytes_down=_u64(o, "bytes_down", what) or 0,
            start_ms=_u64(o, "start_ms", what) or 0,
            end_ms=_u64(o, "end_ms", what) or 0,
            verdict=_str(o, "verdict", what) or "",
            rule=_str(o, "rule", what) or "",
            ended=_str(o, "ended", what),
        )


@dataclass(frozen=True)
class WallNamespace:
    """One namespace of a run's sandbox: its kind, its identity, and whether it is the
    daemon's own (``None`` where comparing says nothing, as for a guest kernel's)."""

    name: str
    id: str
    same_as_host: Optional[bool]

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "WallNamespace":
        o = _check_members(o, what, ("name", "id"), ("same_as_host",))
        v = o.get("same_as_host")
        return cls(
            name=_str(o, "name", what) or "",
            id=_str(o, "id", what) or "",
            same_as_host=None if v is None else _bool(o, "same_as_host", what),
        )


_U32_MAX = (1 << 32) - 1


@dataclass(frozen=True)
class Wall:
    """What the run's sandbox looked like just before its code was handed over, read from
    /proc for the process that then ran it; the daemon handed the code over only because it
    matched the provider's evidence (docs/protocol.md, Wall). A capability set, ``no_new_privs``
    or ``seccomp`` is ``None`` where the kernel shows no such line (gVisor)."""

    uid: int
    euid: int
    gid: int
    groups: list[int]
    cap_inh: Optional[str]
    cap_prm: Optional[str]
    cap_eff: Optional[str]
    cap_bnd: Optional[str]
    cap_amb: Optional[str]
    no_new_privs: Optional[bool]
    seccomp: Optional[int]
    namespaces: list[WallNamespace]
    root_read_only: bool
    network_interfaces: list[str]
    memory_limit_bytes: Optional[int]
    pids_limit: Optional[int]

    @classmethod
    def from_wire(cls, o: Any, what: str = "result.wall") -> "Wall":
        w = what
        caps = ("cap_inh", "cap_prm", "cap_eff", "cap_bnd", "cap_amb")
        o = _check_members(
            o,
            w,
            ("uid", "euid", "gid", "root_read_only"),
            ("groups",)
            + caps
            + ("no_new_privs", "seccomp", "namespaces", "network_interfaces")
            + ("memory_limit_bytes", "pids_limit"),
        )
        groups = _list(o, "groups", w)
        for i, g in enumerate(groups):
            _int({"g": g}, "g", f"{w}.groups[{i}]", 0, _U32_MAX)
        interfaces = _list(o, "network_interfaces", w)
        for i, n in enumerate(interfaces):
            _str({"n": n}, "n", f"{w}.network_interfaces[{i}]")
        nnp = o.get("no_new_privs")
        return cls(
            uid=_int(o, "uid", w, 0, _U32_MAX) or 0,
            euid=_int(o, "euid", w, 0, _U32_MAX) or 0,
            gid=_int(o, "gid", w, 0, _U32_MAX) or 0,
            groups=list(groups),
            cap_inh=_str(o, "cap_inh", w),
            cap_prm=_str(o, "cap_prm", w),
            cap_eff=_str(o, "cap_eff", w),
            cap_bnd=_str(o, "cap_bnd", w),
            cap_amb=_str(o, "cap_amb", w),
            no_new_privs=None if nnp is None else _bool(o, "no_new_privs", w),
            seccomp=_int(o, "seccomp", w, 0, _U32_MAX),
            namespaces=[
                WallNamespace.from_wire(n, f"{w}.namespaces[{i}]")
                for i, n in enumerate(_list(o, "namespaces", w))
            ],
            root_read_only=_bool(o, "root_read_only", w),
            network_interfaces=list(interfaces),
            memory_limit_bytes=_u64(o, "memory_limit_bytes", w),
            pids_limit=_u64(o, "pids_limit", w),
        )


@dataclass(frozen=True)
class RunResult:
    """What a run produced. ``exit_code`` is ``None`` when a signal ended it."""

    exit_code: Optional[int]
    signal: Optional[int]
    timed_out: bool
    oom_killed: bool
    stdout: Output
    stdout_truncated: bool
    stderr: Output
    stderr_truncated: bool
    steps: list[StepResult] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    calls: list[GrantCall] = field(default_factory=list)
    start: Optional[Start] = None
    """How the sandbox started. Read as optional so an older result parses; every result
    the daemon writes now has it."""
    member_age_ms: Optional[int] = None
    """How long the warm pool member waited between being started and being claimed;
    present exactly when ``start`` is ``warm`` (a verified response is checked for it)."""
    wall: Optional[Wall] = None
    """What the sandbox looked like just before its code was handed over (``None`` where the
    provider reads none: docs/warm-pools.md lists where it does)."""
    state_kept: Optional[bool] = None
    """A session's cell only: the interpreter that ran it is the previous cell's, alive with
    its state after this one; ``False`` when it ended during this cell or the cell started a
    fresh one. ``None`` outside cells."""
    interpreter_end: Optional[EndReason] = None
    """A session's cell only: why its interpreter ended during this cell (its state is lost;
    the next cell needs ``restart=True``)."""
    egress: list[EgressReceipt] = field(default_factory=list)
    """Every connection the code asked the broker's egress proxy for, allowed or refused, in
    the order the broker took them (empty without an egress grant). Inside the result
    digest, times included."""

    @classmethod
    def from_wire(cls, o: Any) -> "RunResult":
        w = "result"
        o = _check_members(
            o,
            w,
            _OUTCOME_REQUIRED,
            _OUTCOME_OPTIONAL
            + ("steps", "artifacts", "calls", "start", "member_age_ms", "wall")
            + ("state_kept", "interpreter_end", "egress"),
        )
        kept = o.get("state_kept")
        start = o.get("start")
        if start is not None:
            try:
                start = Start(start)
            except ValueError:
                raise WireError(f"result.start is not warm or cold: {start!r}") from None
        return cls(
            exit_code=_i32(o, "exit_code", w),
            signal=_i32(o, "signal", w),
            timed_out=_bool(o, "timed_out", w),
            oom_killed=_bool(o, "oom_killed", w, False),
            stdout=_bytes(o, "stdout", w),
            stdout_truncated=_bool(o, "stdout_truncated", w),
            stderr=_bytes(o, "stderr", w),
            stderr_truncated=_bool(o, "stderr_truncated", w),
            steps=[
                StepResult.from_wire(s, f"result.steps[{i}]")
                for i, s in enumerate(_list(o, "steps", w))
            ],
            artifacts=[
                Artifact.from_wire(a, f"result.artifacts[{i}]")
                for i, a in enumerate(_list(o, "artifacts", w))
            ],
            calls=[
                GrantCall.from_wire(c, f"result.calls[{i}]")
                for i, c in enumerate(_list(o, "calls", w))
            ],
            start=start,
            member_age_ms=_u64(o, "member_age_ms", w),
            wall=None if o.get("wall") is None else Wall.from_wire(o["wall"]),
            state_kept=None if kept is None else _bool(o, "state_kept", w),
            interpreter_end=_end_reason(o, "interpreter_end", w),
            egress=[
                EgressReceipt.from_wire(g, f"result.egress[{i}]")
                for i, g in enumerate(_list(o, "egress", w))
            ],
        )

    def start_problem(self) -> Optional[str]:
        """What is malformed in ``start`` and ``member_age_ms`` (a member age is present
        exactly when the start is warm), or ``None``."""
        if self.member_age_ms is not None and self.start is not Start.WARM:
            was = "absent" if self.start is None else f'"{self.start.value}"'
            return (
                f"the result is malformed: `member_age_ms` is present but `start` is {was}, "
                'not "warm" (only a warm start has a pool member\'s age)'
            )
        if self.start is Start.WARM and self.member_age_ms is None:
            return (
                'the result is malformed: `start` is "warm" but `member_age_ms` is absent '
                "(a warm start always says how long its pool member waited)"
            )
        return None

    def artifact(self, path: str) -> Artifact:
        """The artifact returned for ``path`` (``KeyError`` if none was asked for)."""
        for a in self.artifacts:
            if a.path == path:
                return a
        raise KeyError(path)


@dataclass(frozen=True)
class ImageRef:
    """The image a run (or a session) ran in: its ``name`` in the daemon's image store and its
    ``identity`` (``sha256:`` over its manifest, the record's ``environment``)."""

    name: str
    identity: str

    def answers(self, selector: str) -> bool:
        """Whether a request's ``image`` (a name or an identity) names this image."""
        return selector in (self.name, self.identity)

    def __str__(self) -> str:
        return f"{self.name} ({self.identity})"

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "ImageRef":
        o = _check_members(o, what, ("name", "identity"))
        return cls(name=_str(o, "name", what) or "", identity=_str(o, "identity", what) or "")


@dataclass(frozen=True)
class SessionOrigin:
    """Where a restored or forked session came from: how it began (``start``), the digest of
    the snapshot it was restored from, the session that snapshot was taken of, and where that
    session's chain stood then (``parent_calls`` calls, the last one's record digest
    ``parent_record_sha256``, ``None`` when it had answered none). The session's chain hangs
    from there: its first call is sequence ``parent_calls + 1`` after
    ``parent_record_sha256``. On the session's :class:`SessionInfo` and on every one of its
    calls' records (inside the record digest, field 14)."""

    start: SessionStart
    snapshot_sha256: str
    parent_session_id: str
    parent_calls: int
    parent_record_sha256: Optional[str] = None

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "SessionOrigin":
        o = _check_members(
            o,
            what,
            ("start", "snapshot_sha256", "parent_session_id", "parent_calls"),
            ("parent_record_sha256",),
        )
        try:
            start = SessionStart(o["start"])
        except ValueError:
            raise WireError(f"{what}.start is not restored or forked: {o['start']!r}") from None
        parent = _str(o, "parent_session_id", what)
        if not is_session_id(parent):
            raise WireError(f"{what}.parent_session_id is not a session id: {parent!r}")
        return cls(
            start=start,
            snapshot_sha256=_digest(o, "snapshot_sha256", what),
            parent_session_id=parent or "",
            parent_calls=_u64(o, "parent_calls", what) or 0,
            parent_record_sha256=(
                None
                if o.get("parent_record_sha256") is None
                else _digest(o, "parent_record_sha256", what)
            ),
        )


@dataclass(frozen=True)
class SessionLink:
    """A session call's place in its session's chain: ``sequence`` is 1 for the session's
    first call and one more for each after it; ``previous_record_sha256`` is the record digest
    of the call before (``None`` exactly for sequence 1). A restored or forked session's chain
    goes on from its parent's (its first call is ``origin.parent_calls + 1``), and every one
    of its records carries its ``origin``."""

    session_id: str
    sequence: int
    previous_record_sha256: Optional[str] = None
    origin: Optional[SessionOrigin] = None
    """Where the session came from, when it was restored or forked (the same on every
    record of the session, and on its :class:`SessionInfo`); ``None`` for a session opened
    fresh. Inside the record digest (field 14)."""

    @classmethod
    def from_wire(cls, o: Any) -> "SessionLink":
        w = "record.session"
        o = _check_members(
            o, w, ("session_id", "sequence"), ("previous_record_sha256", "origin")
        )
        return cls(
            session_id=_str(o, "session_id", w) or "",
            sequence=_u64(o, "sequence", w) or 0,
            previous_record_sha256=(
                None
                if o.get("previous_record_sha256") is None
                else _digest(o, "previous_record_sha256", w)
            ),
            origin=(
                None
                if o.get("origin") is None
                else SessionOrigin.from_wire(o["origin"], f"{w}.origin")
            ),
        )


@dataclass(frozen=True)
class SimulatorRef:
    """The simulator a trial step ran: its ``name`` and ``version`` (from its metadata) and
    the ``sha256`` of its WebAssembly module."""

    name: str
    version: str
    sha256: str

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "SimulatorRef":
        o = _check_members(o, what, ("name", "version", "sha256"))
        return cls(
            name=_str(o, "name", what) or "",
            version=_str(o, "version", what) or "",
            sha256=_digest(o, "sha256", what),
        )


@dataclass(frozen=True)
class TrialOutcome:
    """How one trial (one scenario) of a trial step ended: the scenario's name (never its
    file's), the ``end``, the ``reason`` in words, the ticks run, the simulator's ``score``
    (``None`` from a simulator that does not score), whether it passed, and the
    ``fingerprint`` (SHA-256) of its trajectory."""

    scenario: Optional[str]
    end: TrialEnd
    reason: Optional[str]
    ticks: int
    score: Optional[float]
    passed: bool
    """The trial passed (``pass`` on the wire)."""
    fingerprint: str

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "TrialOutcome":
        o = _check_members(
            o, what, ("end", "ticks", "pass", "fingerprint"), ("scenario", "reason", "score")
        )
        try:
            end = TrialEnd(o["end"])
        except ValueError:
            raise WireError(f"{what}.end is not a trial end: {o['end']!r}") from None
        return cls(
            scenario=_str(o, "scenario", what),
            end=end,
            reason=_str(o, "reason", what),
            ticks=_u64(o, "ticks", what) or 0,
            score=_f64(o, "score", what),
            passed=_bool(o, "pass", what),
            fingerprint=_digest(o, "fingerprint", what),
        )


@dataclass(frozen=True)
class TrialStepRecord:
    """What one trial step's verdict said, as the record carries it: the ``step``'s index
    among the project's steps (from 0), the ``simulator``, whether every trial passed, and
    each trial's outcome, in the order the step named its scenarios."""

    step: int
    simulator: SimulatorRef
    passed: bool
    """Every trial passed (``pass`` on the wire)."""
    trials: list[TrialOutcome] = field(default_factory=list)

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "TrialStepRecord":
        o = _check_members(o, what, ("step", "simulator", "pass", "trials"))
        return cls(
            step=_int(o, "step", what, 0, (1 << 32) - 1) or 0,
            simulator=SimulatorRef.from_wire(o["simulator"], f"{what}.simulator"),
            passed=_bool(o, "pass", what),
            trials=[
                TrialOutcome.from_wire(t, f"{what}.trials[{i}]")
                for i, t in enumerate(_list(o, "trials", what))
            ],
        )


@dataclass(frozen=True)
class RunRecord:
    """The facts a signer needs, with a digest over them."""

    request_id: str
    request_sha256: str
    result_sha256: str
    provider: str
    isolation: Tier
    evidence_sha256: str
    environment: str
    started_unix_ms: int
    ended_unix_ms: int
    record_sha256: str
    minimum_isolation: Optional[Tier] = None
    """The floor the daemon held the run to (the one sent, or its default floor when none
    was). Read as optional so an older record parses; a verified response always has it."""
    session: Optional[SessionLink] = None
    """A session call's link in its session's chain; ``None`` outside sessions."""
    image: Optional[ImageRef] = None
    """The image the code ran in; ``None`` at the process tier (which has no image) and in a
    record written before the member existed. Inside the record digest (field 12)."""
    trials: list[TrialStepRecord] = field(default_factory=list)
    """What each trial step's verdict said, in step order; empty for a run without trial
    steps. Inside the record digest (field 13)."""

    @classmethod
    def from_wire(cls, o: Any) -> "RunRecord":
        w = "record"
        o = _check_members(
            o,
            w,
            (
                "request_id",
                "request_sha256",
                "result_sha256",
                "provider",
                "isolation",
                "evidence_sha256",
                "environment",
                "started_unix_ms",
                "ended_unix_ms",
                "record_sha256",
            ),
            ("minimum_isolation", "session", "image", "trials"),
        )
        floor = o.get("minimum_isolation")
        link = o.get("session")
        image = o.get("image")
        return cls(
            request_id=_str(o, "request_id", w) or "",
            request_sha256=_digest(o, "request_sha256", w),
            result_sha256=_digest(o, "result_sha256", w),
            provider=_str(o, "provider", w) or "",
            isolation=_tier(o, "isolation", w),
            evidence_sha256=_digest(o, "evidence_sha256", w),
            environment=_str(o, "environment", w) or "",
            started_unix_ms=_u64(o, "started_unix_ms", w) or 0,
            ended_unix_ms=_u64(o, "ended_unix_ms", w) or 0,
            record_sha256=_digest(o, "record_sha256", w),
            minimum_isolation=None if floor is None else _tier(o, "minimum_isolation", w),
            session=None if link is None else SessionLink.from_wire(link),
            image=None if image is None else ImageRef.from_wire(image, f"{w}.image"),
            trials=[
                TrialStepRecord.from_wire(t, f"{w}.trials[{i}]")
                for i, t in enumerate(_list(o, "trials", w))
            ],
        )


@dataclass(frozen=True)
class RunResponse:
    """A verified run: every digest recomputed, the tier and provider re-checked.

    ``body`` holds the answer exactly as received and ``request_body`` the request exactly as
    sent, for a signer or an audit log.
    """

    protocol: int
    request_id: str
    provider: str
    isolation: Tier
    duration_ms: int
    request_sha256: str
    result_sha256: str
    result: RunResult
    record: RunRecord
    request_body: bytes = field(repr=False, default=b"")
    body: bytes = field(repr=False, default=b"")

    @classmethod
    def from_wire(cls, o: Any) -> "RunResponse":
        w = "the run response"
        o = _check_members(
            o,
            w,
            (
                "protocol",
                "request_id",
                "provider",
                "isolation",
                "duration_ms",
                "request_sha256",
                "result_sha256",
                "result",
                "record",
            ),
        )
        return cls(
            protocol=_u64(o, "protocol", w) or 0,
            request_id=_str(o, "request_id", w) or "",
            provider=_str(o, "provider", w) or "",
            isolation=_tier(o, "isolation", w),
            duration_ms=_u64(o, "duration_ms", w) or 0,
            request_sha256=_digest(o, "request_sha256", w),
            result_sha256=_digest(o, "result_sha256", w),
            result=RunResult.from_wire(o["result"]),
            record=RunRecord.from_wire(o["record"]),
        )

    # Shorthands for the common case.
    @property
    def stdout(self) -> Output:
        return self.result.stdout

    @property
    def stderr(self) -> Output:
        return self.result.stderr

    @property
    def exit_code(self) -> Optional[int]:
        return self.result.exit_code


@dataclass(frozen=True)
class ProviderInfo:
    """One provider: its tier, whether it is offered now, and its evidence (as received)."""

    name: str
    isolation: Tier
    available: bool
    unavailable_reason: Optional[str]
    evidence: Mapping[str, Any]
    evidence_sha256: str

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "ProviderInfo":
        o = _check_members(
            o,
            what,
            ("name", "isolation", "available", "evidence", "evidence_sha256"),
            ("unavailable_reason",),
        )
        if not isinstance(o["evidence"], Mapping):
            raise WireError(f"{what}.evidence is not an object")
        return cls(
            name=_str(o, "name", what) or "",
            isolation=_tier(o, "isolation", what),
            available=_bool(o, "available", what),
            unavailable_reason=_str(o, "unavailable_reason", what),
            evidence=o["evidence"],
            evidence_sha256=_digest(o, "evidence_sha256", what),
        )


@dataclass(frozen=True)
class SimulatorEntry:
    """A trial simulator an image declares (docs/simulators.md): the ``name`` a trial names
    it by, the ``path`` of its WebAssembly module inside the image, and the module's
    ``sha256`` (what a trial's record names as ``simulator.sha256``)."""

    name: str
    path: str
    sha256: str

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "SimulatorEntry":
        o = _check_members(o, what, ("name", "path", "sha256"))
        return cls(
            name=_str(o, "name", what) or "",
            path=_str(o, "path", what) or "",
            sha256=_digest(o, "sha256", what),
        )


@dataclass(frozen=True)
class ImageInfo:
    """One image the daemon keeps, as ``GET /v1/providers`` lists it: its ``name`` and
    ``identity`` (either names it in a request's ``image``), whether it is the ``default`` (what
    a request that names no image gets), the ``languages`` its check found in it
    (``python``, ``javascript``), whether the VM provider can boot it (``vm_disk``), and the
    trial ``simulators`` it declares (empty when none)."""

    name: str
    identity: str
    default: bool
    languages: list[str] = field(default_factory=list)
    vm_disk: bool = False
    simulators: list[SimulatorEntry] = field(default_factory=list)

    def answers(self, selector: str) -> bool:
        """Whether a request's ``image`` (a name or an identity) names this image."""
        return selector in (self.name, self.identity)

    def simulator(self, name: str) -> Optional[SimulatorEntry]:
        """The simulator of this name the image declares, if it declares one."""
        return next((s for s in self.simulators if s.name == name), None)

    @classmethod
    def from_wire(cls, o: Any, what: str) -> "ImageInfo":
        o = _check_members(
            o, what, ("name", "identity", "default"), ("languages", "vm_disk", "simulators")
        )
        languages = _list(o, "languages", what)
        for i, language in enumerate(languages):
            if language not in ("javascript", "python"):
                raise WireError(
                    f"{what}.languages[{i}] is not javascript or python: {language!r}"
                )
        return cls(
            name=_str(o, "name", what) or "",
            identity=_str(o, "identity", what) or "",
            default=_bool(o, "default", what),
            languages=list(languages),
            vm_disk=_bool(o, "vm_disk", what, False),
            simulators=[
                SimulatorEntry.from_wire(m, f"{what}.simulators[{i}]")
                for i, m in enumerate(_list(o, "simulators", what))
            ],
        )


@dataclass(frozen=True)
class ProvidersResponse:
    """``GET /v1/providers``: the default floor, every provider (cheapest first), and the
    images a request may name (empty from a daemon without images)."""

    protocol: int
    default_floor: Tier
    providers: list[ProviderInfo]
    images: list[ImageInfo] = field(default_factory=list)

    @classmethod
    def from_wire(cls, o: Any) -> "ProvidersResponse":
        w = "the providers response"
        o = _check_members(o, w, ("protocol", "default_floor", "providers"), ("images",))
        return cls(
            protocol=_u64(o, "protocol", w) or 0,
            default_floor=_tier(o, "default_floor", w),
            providers=[
                ProviderInfo.from_wire(p, f"providers[{i}]")
                for i, p in enumerate(_list(o, "providers", w))
            ],
            images=[
                ImageInfo.from_wire(m, f"images[{i}]")
                for i, m in enumerate(_list(o, "images", w))
            ],
        )

    def get(self, name: str) -> Optional[ProviderInfo]:
        """The provider of this name, if the daemon has one."""
        return next((p for p in self.providers if p.name == name), None)

    def image(self, selector: str) -> Optional[ImageInfo]:
        """The image a request's ``image`` of this value (a name or an identity) would name,
        if the daemon has it."""
        return next((m for m in self.images if m.answers(selector)), None)

    @property
    def default_image(self) -> Optional[ImageInfo]:
        """The image a request that names none gets, if the daemon lists one."""
        return next((m for m in self.images if m.default), None)


# --- sessions (docs/sessions.md) -------------------------------------------------------

_HEX = "0123456789abcdef"


def _is_id(value: Any, prefix: str) -> bool:
    if not isinstance(value, str) or not value.startswith(prefix):
        return False
    parts = value[len(prefix) :].split("_")
    return (
        len(parts) == 2
        and len(parts[0]) == 16
        and len(parts[1]) == 32
        and all(c in _HEX for c in parts[0] + parts[1])
    )


def is_session_id(value: Any) -> bool:
    """Whether ``value`` has the shape of a session id: ``ses_``, 16 lowercase hex digits (the
    daemon's instance), ``_``, 32 lowercase hex digits."""
    return _is_id(value, "ses_")


def is_snapshot_id(value: Any) -> bool:
    """Whether ``value`` has the shape of a snapshot id: ``snp_``, 16 lowercase hex digits
    (the daemon's instance), ``_``, 32 lowercase hex digits."""
    return _is_id(value, "snp_")


def is_sha256(value: Any) -> bool:
    """Whether ``value`` is a SHA-256 as the protocol writes one: 64 lowercase hex digits."""
    return isinstance(value, str) and len(value) == 64 and all(c in _HEX for c in value)


def _language(o: Mapping[str, Any], name: str, what: str) -> str:
    v = _str(o, name, what)
    if v not in ("javascript", "python"):
        raise WireError(f"{what}.{name} is not javascript or python: {v!r}")
    return v


@dataclass(frozen=True)
class SessionInfo:
    """A session as the daemon shows it: where it runs (provider, tier, the floor it holds,
    the evidence digest and environment fixed at open), its wall at open, when it expires,
    how far its chain has come (``calls``, ``last_record_sha256``), whether its interpreter
    is alive, and why it ended (``None`` while it is open)."""

    protocol: int
    request_id: Optional[str]
    session_id: str
    language: str
    provider: str
    isolation: Tier
    minimum_isolation: Tier
    evidence_sha256: str
    environment: str
    wall: Wall
    opened_unix_ms: int
    expires_unix_ms: int
    idle_timeout_ms: int
    calls: int
    last_record_sha256: Optional[str]
    interpreter_alive: bool
    end_reason: Optional[EndReason] = None
    image: Optional[ImageRef] = None
    """The image it runs in, fixed at open (every call's record names it too); ``None`` from a
    daemon without images."""
    origin: Optional[SessionOrigin] = None
    """Where it came from, when it was restored from a snapshot or forked (every call's
    record carries the same); ``None`` for a session opened fresh."""

    @classmethod
    def from_wire(cls, o: Any, what: str = "the session") -> "SessionInfo":
        w = what
        o = _check_members(
            o,
            w,
            (
                "protocol",
                "session_id",
                "language",
                "provider",
                "isolation",
                "minimum_isolation",
                "evidence_sha256",
                "environment",
                "wall",
                "opened_unix_ms",
                "expires_unix_ms",
                "idle_timeout_ms",
                "calls",
                "interpreter_alive",
            ),
            ("request_id", "last_record_sha256", "end_reason", "image", "origin"),
        )
        sid = _str(o, "session_id", w)
        if not is_session_id(sid):
            raise WireError(f"{w}.session_id is not a session id: {sid!r}")
        language = _language(o, "language", w)
        last = o.get("last_record_sha256")
        return cls(
            protocol=_u64(o, "protocol", w) or 0,
            request_id=_str(o, "request_id", w),
            session_id=sid or "",
            language=language or "",
            provider=_str(o, "provider", w) or "",
            isolation=_tier(o, "isolation", w),
            minimum_isolation=_tier(o, "minimum_isolation", w),
            evidence_sha256=_digest(o, "evidence_sha256", w),
            environment=_str(o, "environment", w) or "",
            wall=Wall.from_wire(o["wall"], f"{w}.wall"),
            opened_unix_ms=_u64(o, "opened_unix_ms", w) or 0,
            expires_unix_ms=_u64(o, "expires_unix_ms", w) or 0,
            idle_timeout_ms=_u64(o, "idle_timeout_ms", w) or 0,
            calls=_u64(o, "calls", w) or 0,
            last_record_sha256=None if last is None else _digest(o, "last_record_sha256", w),
            interpreter_alive=_bool(o, "interpreter_alive", w),
            end_reason=_end_reason(o, "end_reason", w),
            image=(
                None if o.get("image") is None else ImageRef.from_wire(o["image"], f"{w}.image")
            ),
            origin=(
                None
                if o.get("origin") is None
                else SessionOrigin.from_wire(o["origin"], f"{w}.origin")
            ),
        )


@dataclass(frozen=True)
class SessionList:
    """``GET /v1/sessions``: the caller's own open sessions, oldest first."""

    protocol: int
    sessions: list[SessionInfo]

    def __iter__(self) -> Any:
        return iter(self.sessions)

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, session_id: str) -> Optional[SessionInfo]:
        """The open session of this id, if it is one of the caller's."""
        return next((s for s in self.sessions if s.session_id == session_id), None)

    @classmethod
    def from_wire(cls, o: Any) -> "SessionList":
        w = "the session list"
        o = _check_members(o, w, ("protocol", "sessions"))
        return cls(
            protocol=_u64(o, "protocol", w) or 0,
            sessions=[
                SessionInfo.from_wire(s, f"sessions[{i}]")
                for i, s in enumerate(_list(o, "sessions", w))
            ],
        )


# --- snapshots and forks (docs/sessions.md, "Snapshots and forks") -----------------------


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot of a session: its sandbox saved whole (at runsc, every process's memory) at
    one point of the session's chain (``calls``, ``last_record_sha256``), with ``sha256``
    over its files. A session opened from it (:meth:`Client.open_snapshot`), or a copy of a
    fork, goes on from that point, with fresh randomness. Kept in the daemon's memory until
    ``expires_unix_ms`` or :meth:`Client.delete_snapshot`, and never across a restart of the
    daemon; ``bytes`` counts against the caller's snapshot quota."""

    protocol: int
    request_id: Optional[str]
    """The request this answers (``None`` in a list)."""
    snapshot_id: str
    session_id: str
    """The session it was taken of."""
    sha256: str
    bytes: int
    provider: str
    isolation: Tier
    language: str
    calls: int
    """The session's call count when it was taken."""
    last_record_sha256: Optional[str]
    """The record digest of the session's last call then (``None`` before its first)."""
    checkpoint_ms: int
    created_unix_ms: int
    expires_unix_ms: int

    @classmethod
    def from_wire(cls, o: Any, what: str = "the snapshot") -> "SnapshotInfo":
        w = what
        o = _check_members(
            o,
            w,
            (
                "protocol",
                "snapshot_id",
                "session_id",
                "sha256",
                "bytes",
                "provider",
                "isolation",
                "language",
                "calls",
                "checkpoint_ms",
                "created_unix_ms",
                "expires_unix_ms",
            ),
            ("request_id", "last_record_sha256"),
        )
        snapshot_id = _str(o, "snapshot_id", w)
        if not is_snapshot_id(snapshot_id):
            raise WireError(f"{w}.snapshot_id is not a snapshot id: {snapshot_id!r}")
        sid = _str(o, "session_id", w)
        if not is_session_id(sid):
            raise WireError(f"{w}.session_id is not a session id: {sid!r}")
        last = o.get("last_record_sha256")
        return cls(
            protocol=_u64(o, "protocol", w) or 0,
            request_id=_str(o, "request_id", w),
            snapshot_id=snapshot_id or "",
            session_id=sid or "",
            sha256=_digest(o, "sha256", w),
            bytes=_u64(o, "bytes", w) or 0,
            provider=_str(o, "provider", w) or "",
            isolation=_tier(o, "isolation", w),
            language=_language(o, "language", w),
            calls=_u64(o, "calls", w) or 0,
            last_record_sha256=None if last is None else _digest(o, "last_record_sha256", w),
            checkpoint_ms=_u64(o, "checkpoint_ms", w) or 0,
            created_unix_ms=_u64(o, "created_unix_ms", w) or 0,
            expires_unix_ms=_u64(o, "expires_unix_ms", w) or 0,
        )


@dataclass(frozen=True)
class SnapshotList:
    """``GET /v1/snapshots``: the caller's own snapshots, oldest first."""

    protocol: int
    snapshots: list[SnapshotInfo]

    def __iter__(self) -> Any:
        return iter(self.snapshots)

    def __len__(self) -> int:
        return len(self.snapshots)

    def get(self, snapshot_id: str) -> Optional[SnapshotInfo]:
        """The snapshot of this id, if it is one of the caller's."""
        return next((s for s in self.snapshots if s.snapshot_id == snapshot_id), None)

    @classmethod
    def from_wire(cls, o: Any) -> "SnapshotList":
        w = "the snapshot list"
        o = _check_members(o, w, ("protocol", "snapshots"))
        return cls(
            protocol=_u64(o, "protocol", w) or 0,
            snapshots=[
                SnapshotInfo.from_wire(s, f"snapshots[{i}]")
                for i, s in enumerate(_list(o, "snapshots", w))
            ],
        )


@dataclass(frozen=True)
class ForkAnswer:
    """``POST /v1/sessions/{id}/fork``: the snapshot taken of the session (kept, and counted
    against the caller's quota, until it expires or is deleted) and the copies restored from
    it, each a new session whose ``origin.start`` is ``forked``."""

    protocol: int
    request_id: str
    snapshot: SnapshotInfo
    sessions: list[SessionInfo]

    @classmethod
    def from_wire(cls, o: Any) -> "ForkAnswer":
        w = "the fork answer"
        o = _check_members(o, w, ("protocol", "request_id", "snapshot", "sessions"))
        return cls(
            protocol=_u64(o, "protocol", w) or 0,
            request_id=_str(o, "request_id", w) or "",
            snapshot=SnapshotInfo.from_wire(o["snapshot"], f"{w}.snapshot"),
            sessions=[
                SessionInfo.from_wire(s, f"{w}.sessions[{i}]")
                for i, s in enumerate(_list(o, "sessions", w))
            ],
        )


class OutputStream(str, enum.Enum):
    """Which stream a chunk of output came from."""

    STDOUT = "stdout"
    STDERR = "stderr"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class OutputChunk:
    """Output of a streamed cell or steps call as it was written: **a preview**, covered by no
    digest. ``offset`` counts the bytes of its stream before it, in the call (for steps,
    across the call's steps). The verified response's result holds the whole output; that is
    what counts."""

    stream: OutputStream
    offset: int
    bytes: Output

    @classmethod
    def from_wire(cls, o: Any) -> "OutputChunk":
        w = "a stream chunk"
        o = _check_members(o, w, ("preview", "stream", "offset", "bytes"))
        if o["preview"] is not True:
            raise WireError(f"{w} does not say it is a preview: {o['preview']!r}")
        stream = o["stream"]
        try:
            stream = OutputStream(stream)
        except ValueError:
            raise WireError(f"{w}.stream is not stdout or stderr: {stream!r}") from None
        return cls(
            stream=stream,
            offset=_u64(o, "offset", w) or 0,
            bytes=_bytes(o, "bytes", w),
        )
