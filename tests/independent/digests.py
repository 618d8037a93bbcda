#!/usr/bin/python3
"""An independent implementation of the plimsoll digest encoding, written from
docs/protocol.md (not from the Rust code), checked against the golden vectors.

Usage: digests.py [VECTORS.json]   (default: crates/wire/tests/golden/vectors.json)

Standard library only. Exits 1 when any vector disagrees, and ends with the line
`N passed, M failed`.
"""

import base64
import binascii
import hashlib
import json
import math
import os
import struct
import sys

REQUEST_DOMAIN = "plimsoll/run-request/v1"
RESULT_DOMAIN = "plimsoll/run-result/v1"
RECORD_DOMAIN = "plimsoll/run-record/v1"

TIERS = ("process", "container", "kernel", "vm")
STARTS = ("warm", "cold")
CREDENTIALS = ("static", "minted")
LANGUAGES = ("javascript", "python")
TRIAL_ENDS = (
    "completed",
    "failed",
    "controller_timeout",
    "controller_garbage",
    "controller_exited",
    "controller_flood",
)

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


class Invalid(Exception):
    """The input does not follow the protocol."""


# --- JSON input ------------------------------------------------------------------------


def no_duplicate_keys(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise Invalid(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def check_keys(obj, where, required, optional=()):
    if not isinstance(obj, dict):
        raise Invalid(f"{where} must be an object")
    unknown = set(obj) - set(required) - set(optional)
    if unknown:
        raise Invalid(f"{where}: unknown field(s) {sorted(unknown)}")
    for key in required:
        if key not in obj:
            raise Invalid(f"{where}: missing field {key!r}")


def opt(obj, key):
    """An optional member: absent and null are the same."""
    return obj.get(key)


def want_int(value, where, lo, hi):
    # bool is an int in Python; JSON true is not a number.
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise Invalid(f"{where} must be an integer in [{lo}, {hi}]")
    return value


def want_bool(value, where):
    if not isinstance(value, bool):
        raise Invalid(f"{where} must be true or false")
    return value


def want_f64(value, where):
    """A JSON number, as the binary64 nearest it (an integer is one too); finite only."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(f"{where} must be a number")
    try:
        value = float(value)
    except OverflowError:
        raise Invalid(f"{where} is out of the binary64 range") from None
    if not math.isfinite(value):
        raise Invalid(f"{where} must be finite")
    return value


def want_str(value, where):
    if not isinstance(value, str):
        raise Invalid(f"{where} must be a string")
    return value


def utf8(text, where):
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate from a \\ud800 escape
        raise Invalid(f"{where} is not valid Unicode: {e}") from None


def wire_bytes(value, where):
    """Bytes on the wire: a JSON string (its UTF-8), or {"base64": standard, padded}."""
    if isinstance(value, str):
        return utf8(value, where)
    if isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        text = value["base64"]
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as e:
            raise Invalid(f"{where}: bad base64: {e}") from None
        if base64.b64encode(raw).decode("ascii") != text:
            raise Invalid(f"{where}: base64 is not in canonical padded form")
        return raw
    raise Invalid(f'{where} must be a string or {{"base64": "..."}}')


def want_tier(value, where):
    if value not in TIERS:
        raise Invalid(f"{where} must be one of {TIERS}")
    return value


# --- The encoding ------------------------------------------------------------------------


def frame(data):
    """u64 big-endian length, then the bytes."""
    return len(data).to_bytes(8, "big") + data


class Encoding:
    def __init__(self, domain=None):
        self.buf = bytearray()
        if domain is not None:
            self.buf += frame(domain.encode("utf-8"))

    def raw(self, name, value):
        self.buf += frame(name.encode("utf-8")) + frame(value)

    def string(self, name, value, where=None):
        self.raw(name, utf8(value, where or name))

    def u64(self, name, value):
        self.raw(name, value.to_bytes(8, "big", signed=False))

    def i64(self, name, value):
        self.raw(name, value.to_bytes(8, "big", signed=True))

    def f64(self, name, value):
        """The IEEE 754 binary64 bits, big-endian."""
        self.raw(name, struct.pack(">d", value))

    def boolean(self, name, value):
        self.raw(name, b"\x01" if value else b"\x00")

    def nested(self, name, inner):
        self.raw(name, bytes(inner.buf))

    def items(self, name, items):
        """A list: left out when empty, else u64 BE count, then each item framed."""
        if not items:
            return
        value = len(items).to_bytes(8, "big")
        for item in items:
            value += frame(item)
        self.raw(name, value)

    def bytes(self):
        return bytes(self.buf)


LIMITS = ("timeout_ms", "memory_bytes", "output_bytes", "pids", "disk_bytes", "artifact_bytes")


def encode_request(r):
    check_keys(
        r,
        "request",
        ("protocol", "request_id", "run"),
        ("minimum_isolation", "provider", "limits", "grant", "image"),
    )
    want_str(r["request_id"], "request_id")  # checked, never encoded
    e = Encoding(REQUEST_DOMAIN)
    e.u64("protocol", want_int(r["protocol"], "protocol", 0, U32_MAX))
    if opt(r, "minimum_isolation") is not None:
        e.string("minimum_isolation", want_tier(r["minimum_isolation"], "minimum_isolation"))
    if opt(r, "provider") is not None:
        e.string("provider", want_str(r["provider"], "provider"))
    if opt(r, "limits") is not None:
        limits = r["limits"]
        check_keys(limits, "limits", (), LIMITS)
        le = Encoding()
        for name in LIMITS:
            if opt(limits, name) is not None:
                le.u64(name, want_int(limits[name], f"limits.{name}", 0, U64_MAX))
        e.nested("limits", le)  # present even when it holds no field
    e.nested("run", encode_run(r["run"]))
    if opt(r, "grant") is not None:
        e.string("grant", want_str(r["grant"], "grant"))
    # Field 7: the image named, a name or an identity, as a string.
    if opt(r, "image") is not None:
        e.string("image", want_str(r["image"], "image"))
    return e.bytes()


def encode_run(run):
    if not isinstance(run, dict):
        raise Invalid("run must be an object")
    kind = run.get("kind")
    e = Encoding()
    if kind == "snippet":
        check_keys(run, "run", ("kind", "language", "code"))
        if run["language"] not in LANGUAGES:
            raise Invalid(f"run.language must be one of {LANGUAGES}")
        e.string("kind", "snippet")
        e.string("language", run["language"])
        e.string("code", want_str(run["code"], "run.code"))
    elif kind == "project":
        check_keys(run, "run", ("kind", "steps"), ("files", "artifacts"))
        e.string("kind", "project")
        files = []
        for i, f in enumerate(opt(run, "files") or []):
            where = f"run.files[{i}]"
            check_keys(f, where, ("path", "content"), ("executable",))
            fe = Encoding()
            fe.string("path", want_str(f["path"], f"{where}.path"))
            fe.raw("content", wire_bytes(f["content"], f"{where}.content"))
            executable = opt(f, "executable")
            fe.boolean("executable", False if executable is None else want_bool(executable, where))
            files.append(fe.bytes())
        e.items("files", files)
        steps = []
        for i, s in enumerate(run["steps"]):
            where = f"run.steps[{i}]"
            check_keys(s, where, ("run",), ("name",))
            se = Encoding()
            if opt(s, "name") is not None:
                se.string("name", want_str(s["name"], f"{where}.name"))
            se.string("run", want_str(s["run"], f"{where}.run"))
            steps.append(se.bytes())
        e.items("steps", steps)
        artifacts = [
            utf8(want_str(a, f"run.artifacts[{i}]"), f"run.artifacts[{i}]")
            for i, a in enumerate(opt(run, "artifacts") or [])
        ]
        e.items("artifacts", artifacts)
    else:
        raise Invalid("run.kind must be snippet or project")
    return e


OUTCOME_REQUIRED = ("timed_out", "stdout", "stdout_truncated", "stderr", "stderr_truncated")
OUTCOME_OPTIONAL = ("exit_code", "signal", "oom_killed")


def encode_outcome(e, o, where):
    for name in ("exit_code", "signal"):
        if opt(o, name) is not None:
            e.i64(name, want_int(o[name], f"{where}.{name}", I32_MIN, I32_MAX))
    e.boolean("timed_out", want_bool(o["timed_out"], f"{where}.timed_out"))
    oom = opt(o, "oom_killed")
    e.boolean("oom_killed", False if oom is None else want_bool(oom, f"{where}.oom_killed"))
    e.raw("stdout", wire_bytes(o["stdout"], f"{where}.stdout"))
    e.boolean("stdout_truncated", want_bool(o["stdout_truncated"], f"{where}.stdout_truncated"))
    e.raw("stderr", wire_bytes(o["stderr"], f"{where}.stderr"))
    e.boolean("stderr_truncated", want_bool(o["stderr_truncated"], f"{where}.stderr_truncated"))


def encode_result(r):
    check_keys(
        r,
        "result",
        OUTCOME_REQUIRED,
        OUTCOME_OPTIONAL
        + ("steps", "artifacts", "calls", "start", "member_age_ms", "wall")
        + ("state_kept", "interpreter_end", "egress"),
    )
    e = Encoding(RESULT_DOMAIN)
    encode_outcome(e, r, "result")
    steps = []
    for i, s in enumerate(opt(r, "steps") or []):
        where = f"result.steps[{i}]"
        check_keys(s, where, OUTCOME_REQUIRED + ("duration_ms",), OUTCOME_OPTIONAL + ("name",))
        want_int(s["duration_ms"], f"{where}.duration_ms", 0, U64_MAX)  # checked, never encoded
        se = Encoding()
        if opt(s, "name") is not None:
            se.string("name", want_str(s["name"], f"{where}.name"))
        encode_outcome(se, s, where)
        steps.append(se.bytes())
    e.items("steps", steps)
    artifacts = []
    for i, a in enumerate(opt(r, "artifacts") or []):
        where = f"result.artifacts[{i}]"
        check_keys(a, where, ("path", "found", "size", "content", "truncated"))
        ae = Encoding()
        ae.string("path", want_str(a["path"], f"{where}.path"))
        ae.boolean("found", want_bool(a["found"], f"{where}.found"))
        ae.u64("size", want_int(a["size"], f"{where}.size", 0, U64_MAX))
        ae.raw("content", wire_bytes(a["content"], f"{where}.content"))
        ae.boolean("truncated", want_bool(a["truncated"], f"{where}.truncated"))
        artifacts.append(ae.bytes())
    e.items("artifacts", artifacts)
    calls = []
    for i, c in enumerate(opt(r, "calls") or []):
        where = f"result.calls[{i}]"
        check_keys(
            c,
            where,
            ("method", "request_bytes", "response_bytes", "latency_ms"),
            ("route", "status", "error", "credential"),
        )
        want_int(c["latency_ms"], f"{where}.latency_ms", 0, U64_MAX)  # checked, never encoded
        ce = Encoding()
        ce.string("method", want_str(c["method"], f"{where}.method"))
        if opt(c, "route") is not None:
            ce.string("route", want_str(c["route"], f"{where}.route"))
        if opt(c, "status") is not None:
            ce.u64("status", want_int(c["status"], f"{where}.status", 0, 65535))
        if opt(c, "error") is not None:
            ce.string("error", want_str(c["error"], f"{where}.error"))
        ce.u64("request_bytes", want_int(c["request_bytes"], f"{where}.request_bytes", 0, U64_MAX))
        ce.u64("response_bytes", want_int(c["response_bytes"], f"{where}.response_bytes", 0, U64_MAX))
        # The call's field 7, left out when absent (or null): a call listed before it existed.
        if opt(c, "credential") is not None:
            if c["credential"] not in CREDENTIALS:
                raise Invalid(f"{where}.credential must be one of {CREDENTIALS}")
            ce.string("credential", c["credential"])
        calls.append(ce.bytes())
    e.items("calls", calls)
    # Fields 12 and 13, left out when absent (or null) like every optional field.
    if opt(r, "start") is not None:
        if r["start"] not in STARTS:
            raise Invalid(f"result.start must be one of {STARTS}")
        e.string("start", r["start"])
    if opt(r, "member_age_ms") is not None:
        e.u64("member_age_ms", want_int(r["member_age_ms"], "result.member_age_ms", 0, U64_MAX))
    # Field 14, likewise.
    if opt(r, "wall") is not None:
        e.raw("wall", encode_wall(r["wall"]))
    # Fields 15 and 16, a session cell's, likewise.
    if opt(r, "state_kept") is not None:
        e.boolean("state_kept", want_bool(r["state_kept"], "result.state_kept"))
    if opt(r, "interpreter_end") is not None:
        e.string("interpreter_end", want_str(r["interpreter_end"], "result.interpreter_end"))
    # Field 17: the egress receipts, a list of nested; left out when empty or null. Every
    # member is encoded, the times included.
    egress = opt(r, "egress") or []
    if not isinstance(egress, list):
        raise Invalid("result.egress must be a list")
    e.items(
        "egress",
        [encode_egress_receipt(g, f"result.egress[{i}]") for i, g in enumerate(egress)],
    )
    return e.bytes()


EGRESS_REQUIRED = (
    "host",
    "port",
    "kind",
    "bytes_up",
    "bytes_down",
    "start_ms",
    "end_ms",
    "verdict",
    "rule",
)


def encode_egress_receipt(g, where):
    check_keys(g, where, EGRESS_REQUIRED, ("address", "sni", "ended"))
    e = Encoding()
    e.string("host", want_str(g["host"], f"{where}.host"))
    e.u64("port", want_int(g["port"], f"{where}.port", 0, 65535))
    e.string("kind", want_str(g["kind"], f"{where}.kind"))
    for name in ("address", "sni"):
        if opt(g, name) is not None:
            e.string(name, want_str(g[name], f"{where}.{name}"))
    for name in ("bytes_up", "bytes_down", "start_ms", "end_ms"):
        e.u64(name, want_int(g[name], f"{where}.{name}", 0, U64_MAX))
    e.string("verdict", want_str(g["verdict"], f"{where}.verdict"))
    e.string("rule", want_str(g["rule"], f"{where}.rule"))
    if opt(g, "ended") is not None:
        e.string("ended", want_str(g["ended"], f"{where}.ended"))
    return e.bytes()


WALL_CAPS = ("cap_inh", "cap_prm", "cap_eff", "cap_bnd", "cap_amb")


def encode_wall(w):
    where = "result.wall"
    check_keys(
        w,
        where,
        ("uid", "euid", "gid", "root_read_only"),
        ("groups",) + WALL_CAPS
        + ("no_new_privs", "seccomp", "namespaces", "network_interfaces")
        + ("memory_limit_bytes", "pids_limit"),
    )
    e = Encoding()
    for name in ("uid", "euid", "gid"):
        e.u64(name, want_int(w[name], f"{where}.{name}", 0, U32_MAX))
    groups = opt(w, "groups") or []
    if not isinstance(groups, list):
        raise Invalid(f"{where}.groups must be a list")
    e.items(
        "groups",
        [
            want_int(g, f"{where}.groups[{i}]", 0, U32_MAX).to_bytes(8, "big")
            for i, g in enumerate(groups)
        ],
    )
    for name in WALL_CAPS:
        if opt(w, name) is not None:
            e.string(name, want_str(w[name], f"{where}.{name}"))
    if opt(w, "no_new_privs") is not None:
        e.boolean("no_new_privs", want_bool(w["no_new_privs"], f"{where}.no_new_privs"))
    if opt(w, "seccomp") is not None:
        e.u64("seccomp", want_int(w["seccomp"], f"{where}.seccomp", 0, U32_MAX))
    namespaces = []
    for i, n in enumerate(opt(w, "namespaces") or []):
        nw = f"{where}.namespaces[{i}]"
        check_keys(n, nw, ("name", "id"), ("same_as_host",))
        ne = Encoding()
        ne.string("name", want_str(n["name"], f"{nw}.name"))
        ne.string("id", want_str(n["id"], f"{nw}.id"))
        if opt(n, "same_as_host") is not None:
            ne.boolean("same_as_host", want_bool(n["same_as_host"], f"{nw}.same_as_host"))
        namespaces.append(ne.bytes())
    e.items("namespaces", namespaces)
    e.boolean("root_read_only", want_bool(w["root_read_only"], f"{where}.root_read_only"))
    interfaces = opt(w, "network_interfaces") or []
    if not isinstance(interfaces, list):
        raise Invalid(f"{where}.network_interfaces must be a list")
    e.items(
        "network_interfaces",
        [
            utf8(want_str(x, f"{where}.network_interfaces[{i}]"), f"{where}.network_interfaces[{i}]")
            for i, x in enumerate(interfaces)
        ],
    )
    for name in ("memory_limit_bytes", "pids_limit"):
        if opt(w, name) is not None:
            e.u64(name, want_int(w[name], f"{where}.{name}", 0, U64_MAX))
    return e.bytes()


RECORD_STRINGS = ("request_id", "request_sha256", "result_sha256", "provider")


def encode_record(r):
    check_keys(
        r,
        "record",
        RECORD_STRINGS
        + (
            "isolation",
            "evidence_sha256",
            "environment",
            "started_unix_ms",
            "ended_unix_ms",
            "record_sha256",
        ),
        ("minimum_isolation", "session", "image", "trials"),
    )
    e = Encoding(RECORD_DOMAIN)
    for name in RECORD_STRINGS:
        e.string(name, want_str(r[name], name))
    e.string("isolation", want_tier(r["isolation"], "isolation"))
    if opt(r, "minimum_isolation") is not None:
        e.string("minimum_isolation", want_tier(r["minimum_isolation"], "minimum_isolation"))
    e.string("evidence_sha256", want_str(r["evidence_sha256"], "evidence_sha256"))
    e.string("environment", want_str(r["environment"], "environment"))
    e.u64("started_unix_ms", want_int(r["started_unix_ms"], "started_unix_ms", 0, U64_MAX))
    e.u64("ended_unix_ms", want_int(r["ended_unix_ms"], "ended_unix_ms", 0, U64_MAX))
    # Field 11: a session call's link, its members as fields of the record itself.
    if opt(r, "session") is not None:
        link = r["session"]
        check_keys(
            link, "record.session", ("session_id", "sequence"), ("previous_record_sha256", "origin")
        )
        e.string("session_id", want_str(link["session_id"], "record.session.session_id"))
        e.u64("sequence", want_int(link["sequence"], "record.session.sequence", 0, U64_MAX))
        if opt(link, "previous_record_sha256") is not None:
            e.string(
                "previous_record_sha256",
                want_str(link["previous_record_sha256"], "record.session.previous_record_sha256"),
            )
    # Field 12: the image the code ran in, nested: name, then identity.
    if opt(r, "image") is not None:
        image = r["image"]
        check_keys(image, "record.image", ("name", "identity"), ())
        ie = Encoding()
        ie.string("name", want_str(image["name"], "record.image.name"))
        ie.string("identity", want_str(image["identity"], "record.image.identity"))
        e.nested("image", ie)
    # Field 13: each trial step's verdict, a list of nested; left out when empty or null.
    steps = []
    for i, s in enumerate(opt(r, "trials") or []):
        steps.append(encode_trial_step(s, f"record.trials[{i}]"))
    e.items("trials", steps)
    # Field 14: where a restored or forked session came from, nested; left out when absent.
    link = opt(r, "session")
    if link is not None and opt(link, "origin") is not None:
        o = link["origin"]
        w = "record.session.origin"
        check_keys(
            o,
            w,
            ("start", "snapshot_sha256", "parent_session_id", "parent_calls"),
            ("parent_record_sha256",),
        )
        start = want_str(o["start"], f"{w}.start")
        if start not in ("restored", "forked"):
            raise Invalid(f"{w}.start must be restored or forked")
        oe = Encoding()
        oe.string("start", start)
        oe.string("snapshot_sha256", want_str(o["snapshot_sha256"], f"{w}.snapshot_sha256"))
        oe.string("parent_session_id", want_str(o["parent_session_id"], f"{w}.parent_session_id"))
        if opt(o, "parent_record_sha256") is not None:
            oe.string(
                "parent_record_sha256",
                want_str(o["parent_record_sha256"], f"{w}.parent_record_sha256"),
            )
        oe.u64("parent_calls", want_int(o["parent_calls"], f"{w}.parent_calls", 0, U64_MAX))
        e.nested("origin", oe)
    return e.bytes()


def encode_trial_step(s, where):
    check_keys(s, where, ("step", "simulator", "pass", "trials"))
    e = Encoding()
    e.u64("step", want_int(s["step"], f"{where}.step", 0, U32_MAX))
    sim = s["simulator"]
    check_keys(sim, f"{where}.simulator", ("name", "version", "sha256"))
    se = Encoding()
    for name in ("name", "version", "sha256"):
        se.string(name, want_str(sim[name], f"{where}.simulator.{name}"))
    e.nested("simulator", se)
    e.boolean("pass", want_bool(s["pass"], f"{where}.pass"))
    if not isinstance(s["trials"], list):
        raise Invalid(f"{where}.trials must be a list")
    trials = []
    for i, t in enumerate(s["trials"]):
        tw = f"{where}.trials[{i}]"
        check_keys(t, tw, ("end", "ticks", "pass", "fingerprint"), ("scenario", "reason", "score"))
        te = Encoding()
        if opt(t, "scenario") is not None:
            te.string("scenario", want_str(t["scenario"], f"{tw}.scenario"))
        if t["end"] not in TRIAL_ENDS:
            raise Invalid(f"{tw}.end must be one of {TRIAL_ENDS}")
        te.string("end", t["end"])
        if opt(t, "reason") is not None:
            te.string("reason", want_str(t["reason"], f"{tw}.reason"))
        te.u64("ticks", want_int(t["ticks"], f"{tw}.ticks", 0, U64_MAX))
        if opt(t, "score") is not None:
            te.f64("score", want_f64(t["score"], f"{tw}.score"))
        te.boolean("pass", want_bool(t["pass"], f"{tw}.pass"))
        te.string("fingerprint", want_str(t["fingerprint"], f"{tw}.fingerprint"))
        trials.append(te.bytes())
    e.items("trials", trials)
    return e.bytes()


def drop_nulls(value):
    """Absent optional members are left out of canonical JSON; null means absent."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def canonical_evidence(ev):
    check_keys(
        ev,
        "evidence",
        ("provider", "isolation", "config", "binaries", "checks", "environment", "checked_unix_ms"),
        ("probe",),
    )
    want_tier(ev["isolation"], "isolation")
    # Keys sorted by code point, which is the order of their UTF-8 bytes; compact; UTF-8
    # as is (no \\u escapes but the ones JSON requires).
    text = json.dumps(drop_nulls(ev), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return utf8(text, "evidence")


ENCODERS = {
    "request": encode_request,
    "result": encode_result,
    "record": encode_record,
    "evidence": canonical_evidence,
}


# --- Checking the vectors -------------------------------------------------------------------


def check(vector, by_name):
    """Returns a list of problems with one vector (empty when it agrees)."""
    kind = vector["kind"]
    if kind not in ENCODERS:
        return [f"unknown kind {kind!r}"]
    encoding = ENCODERS[kind](vector["input"])
    digest = hashlib.sha256(encoding).hexdigest()
    problems = []
    if encoding.hex() != vector["encoding_hex"]:
        problems.append(
            f"encoding differs\n    stored   {vector['encoding_hex']}\n    computed {encoding.hex()}"
        )
    if digest != vector["sha256"]:
        problems.append(f"sha256 differs: stored {vector['sha256']}, computed {digest}")
    if kind == "record" and vector["input"]["record_sha256"] != digest:
        problems.append("input.record_sha256 is not the record's digest")
    if kind == "evidence" and vector.get("canonical_json") != encoding.decode("utf-8"):
        problems.append("canonical_json differs")
    other = vector.get("same_digest_as")
    if other is not None:
        if other not in by_name:
            problems.append(f"same_digest_as names no vector {other!r}")
        elif by_name[other]["sha256"] != digest:
            problems.append(f"digest differs from {other}'s")
    return problems


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", "crates", "wire", "tests", "golden", "vectors.json")
    path = argv[1] if len(argv) > 1 else default
    with open(path, encoding="utf-8") as f:
        data = json.load(f, object_pairs_hook=no_duplicate_keys)
    vectors = data["vectors"]
    by_name = {v["name"]: v for v in vectors}
    passed = failed = 0
    for vector in vectors:
        try:
            problems = check(vector, by_name)
        except (Invalid, KeyError) as e:
            problems = [f"input refused: {e!r}"]
        if problems:
            failed += 1
            print(f"FAIL {vector['name']}")
            for p in problems:
                print(f"  {p}")
        else:
            passed += 1
            print(f"ok   {vector['name']}  {vector['sha256']}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
