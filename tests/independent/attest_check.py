#!/usr/bin/env python3
"""An independent check of plimsoll-attest bundles and golden vectors, written from
docs/attestation.md (not from the Rust code), with Python's `cryptography` package for
Ed25519 and the standard library for the rest.

Usage:
  attest_check.py bundle PUBLIC.pem BUNDLE   every line: canonical JSON, DSSE PAE and Ed25519
                                             signature, key id, sequence, predecessor digest,
                                             exchange digest, record digest; the session
                                             chains; the close
  attest_check.py golden DIR                 the golden vectors in DIR (PAE bytes, signatures,
                                             key id), then DIR/bundle.jsonl and
                                             DIR/session.jsonl as bundles, and
                                             DIR/session-reordered.jsonl refused; then the
                                             bundle of trial records held below
                                             (TRIAL_BUNDLE)

Needs `cryptography` (pip install cryptography). Exits 0 when everything checks; otherwise
prints `REFUSED: line N ...` to stderr and exits 1.
"""

import base64
import binascii
import hashlib
import json
import os
import struct
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
RUN_TYPE = "urn:plimsoll:attest:run:v1"
CLOSE_TYPE = "urn:plimsoll:attest:close:v1"
GENESIS = "0" * 64
RECORD_DOMAIN = "plimsoll/run-record/v1"


class Refused(Exception):
    pass


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


class Number(float):
    """A JSON number written with a fraction or an exponent (a trial's score), read as the
    binary64 nearest it and kept as the line spelt it. Writers spell one number differently
    (`1e-7`, `1e-07`; `1e+21`, `1e21`, `1000000000000000000000.0`), and which a line uses
    is the signer's JSON library's choice, so the canonical form here takes the number as
    written; `exchange_sha256`, which the signature covers, pins the spelling signed."""

    def __new__(cls, text):
        value = super().__new__(cls, text)
        value.text = text
        return value


def parse_number(text):
    """A number with a fraction or exponent: finite, and written with the significant digits
    of the shortest decimal that reads back as the same binary64 (what every shortest
    round-trip writer writes, whatever its layout), so `0.1000000000000000055511151231257827`
    is refused where `0.1` is taken."""
    value = Number(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise Refused(f"the number {text} is not a finite binary64")
    if significant_digits(text) != significant_digits(repr(float(value))):
        raise Refused(f"the number {text} is not written with its shortest digits")
    return value


def significant_digits(text):
    """The digits of a decimal number's significand, without leading or trailing zeros."""
    mantissa = text.lower().lstrip("-").split("e")[0]
    return mantissa.replace(".", "").strip("0")


def loads(text):
    """JSON as plimsoll-attest's lines hold it, numbers with a fraction or an exponent kept as
    written (Number)."""
    return json.loads(text, parse_float=parse_number, parse_constant=refuse_constant)


def refuse_constant(name):
    raise Refused(f"{name} is not JSON")


def canonical(value):
    """The JSON bytes plimsoll-attest writes: keys in their stored order, no whitespace,
    strings escaped as json.dumps escapes them with ensure_ascii=False (non-ASCII characters
    as themselves), and each number with a fraction or an exponent as its line spelt it."""
    return "".join(write_canonical(value)).encode("utf-8")


def write_canonical(value):
    if isinstance(value, dict):
        yield "{"
        for i, (k, v) in enumerate(value.items()):
            if i:
                yield ","
            yield json.dumps(k, ensure_ascii=False)
            yield ":"
            yield from write_canonical(v)
        yield "}"
    elif isinstance(value, list):
        yield "["
        for i, v in enumerate(value):
            if i:
                yield ","
            yield from write_canonical(v)
        yield "]"
    elif isinstance(value, Number):
        yield value.text
    elif isinstance(value, float):
        raise Refused(f"a number without its spelling: {value!r}")
    else:
        yield json.dumps(value, ensure_ascii=False)


def pae(payload_type, body):
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def b64_strict(text, what):
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise Refused(f"{what} is not base64 ({e})")
    if base64.b64encode(raw).decode("ascii") != text:
        raise Refused(f"{what} is not canonical base64")
    return raw


def load_public(path):
    with open(path, "rb") as f:
        return public_key(f.read(), path)


def public_key(pem, what):
    key = load_pem_public_key(pem)
    if not isinstance(key, Ed25519PublicKey):
        raise Refused(f"{what} is not an Ed25519 public key")
    der = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return key, sha256_hex(der)


def frame(b):
    return len(b).to_bytes(8, "big") + b


def record_sha256(rec):
    """The record's digest encoding (docs/protocol.md), written here from the spec."""
    out = frame(RECORD_DOMAIN.encode())
    fields = [
        ("request_id", rec["request_id"].encode()),
        ("request_sha256", rec["request_sha256"].encode()),
        ("result_sha256", rec["result_sha256"].encode()),
        ("provider", rec["provider"].encode()),
        ("isolation", rec["isolation"].encode()),
    ]
    # The applied floor: left out when absent or null (records written before it existed).
    if rec.get("minimum_isolation") is not None:
        fields.append(("minimum_isolation", rec["minimum_isolation"].encode()))
    fields += [
        ("evidence_sha256", rec["evidence_sha256"].encode()),
        ("environment", rec["environment"].encode()),
        ("started_unix_ms", rec["started_unix_ms"].to_bytes(8, "big")),
        ("ended_unix_ms", rec["ended_unix_ms"].to_bytes(8, "big")),
    ]
    # A session call's link: left out when absent or null (runs outside sessions).
    link = rec.get("session")
    if link is not None:
        fields += [
            ("session_id", link["session_id"].encode()),
            ("sequence", link["sequence"].to_bytes(8, "big")),
        ]
        if link.get("previous_record_sha256") is not None:
            fields.append(("previous_record_sha256", link["previous_record_sha256"].encode()))
    # Field 12, the image the code ran in: left out when absent or null (the process tier,
    # and records written before it existed).
    image = rec.get("image")
    if image is not None:
        nested = [("name", image["name"].encode()), ("identity", image["identity"].encode())]
        fields.append(("image", fields_bytes(nested)))
    # Field 13, the trial steps' verdicts: left out when empty, absent or null.
    steps = rec.get("trials") or []
    if steps:
        fields.append(("trials", list_bytes([trial_step_bytes(s) for s in steps])))
    # Field 14, where a restored or forked session came from: left out when absent or null.
    origin = (link or {}).get("origin")
    if origin is not None:
        nested = [
            ("start", origin["start"].encode()),
            ("snapshot_sha256", origin["snapshot_sha256"].encode()),
            ("parent_session_id", origin["parent_session_id"].encode()),
        ]
        if origin.get("parent_record_sha256") is not None:
            nested.append(("parent_record_sha256", origin["parent_record_sha256"].encode()))
        nested.append(("parent_calls", origin["parent_calls"].to_bytes(8, "big")))
        fields.append(("origin", fields_bytes(nested)))
    return sha256_hex(out + fields_bytes(fields))


def fields_bytes(fields):
    """A nested encoding: each field's name and value, framed, in order."""
    return b"".join(frame(name.encode()) + frame(value) for name, value in fields)


def list_bytes(items):
    """A list: its count, then each item's encoding, framed."""
    return len(items).to_bytes(8, "big") + b"".join(frame(item) for item in items)


def trial_step_bytes(step):
    """One trial step's nested encoding: step, simulator (nested), pass, then its trials
    (left out when empty)."""
    sim = step["simulator"]
    fields = [
        ("step", step["step"].to_bytes(8, "big")),
        (
            "simulator",
            fields_bytes(
                [
                    ("name", sim["name"].encode()),
                    ("version", sim["version"].encode()),
                    ("sha256", sim["sha256"].encode()),
                ]
            ),
        ),
        ("pass", boolean(step["pass"])),
    ]
    trials = step.get("trials") or []
    if trials:
        fields.append(("trials", list_bytes([trial_bytes(t) for t in trials])))
    return fields_bytes(fields)


def trial_bytes(trial):
    """One trial's nested encoding; scenario, reason and score left out when absent or null;
    the score as the IEEE 754 bits of its binary64, big-endian (a JSON integer is its
    binary64 first)."""
    fields = []
    if trial.get("scenario") is not None:
        fields.append(("scenario", trial["scenario"].encode()))
    fields.append(("end", trial["end"].encode()))
    if trial.get("reason") is not None:
        fields.append(("reason", trial["reason"].encode()))
    fields.append(("ticks", trial["ticks"].to_bytes(8, "big")))
    score = trial.get("score")
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise Refused(f"a score is a number, not {score!r}")
        fields.append(("score", struct.pack(">d", float(score))))
    fields.append(("pass", boolean(trial["pass"])))
    fields.append(("fingerprint", trial["fingerprint"].encode()))
    return fields_bytes(fields)


def boolean(value):
    if not isinstance(value, bool):
        raise Refused(f"{value!r} is not a boolean")
    return b"\x01" if value else b"\x00"


CONTROLLER_FAULTS = (
    "controller_timeout",
    "controller_garbage",
    "controller_exited",
    "controller_flood",
)
TRIAL_ENDS = ("completed", "failed") + CONTROLLER_FAULTS


def check_trials(rec):
    """What docs/protocol.md says of a record's trial steps beyond their shape: steps in
    increasing order, 1 to 1000 trials each, a step's pass exactly when every trial passed,
    no pass with a controller's fault, digests as 64 lowercase hex digits."""
    previous = None
    for i, step in enumerate(rec.get("trials") or []):
        where = f"record.trials[{i}]"
        if previous is not None and step["step"] <= previous:
            raise Refused(f"{where}: step {step['step']} does not come after step {previous}")
        previous = step["step"]
        trials = step["trials"]
        if not 1 <= len(trials) <= 1000:
            raise Refused(f"{where}: {len(trials)} trials, not 1 to 1000")
        if step["pass"] != all(t["pass"] for t in trials):
            raise Refused(f"{where}: pass is {step['pass']}, but not as its trials say")
        if not is_sha256_hex(step["simulator"]["sha256"]):
            raise Refused(f"{where}.simulator.sha256 is not 64 lowercase hex digits")
        for j, t in enumerate(trials):
            if t["end"] not in TRIAL_ENDS:
                raise Refused(f"{where}.trials[{j}]: `{t['end']}` is not a trial end")
            if t["pass"] and t["end"] in CONTROLLER_FAULTS:
                raise Refused(f"{where}.trials[{j}]: passed with a controller's fault ({t['end']})")
            if not is_sha256_hex(t["fingerprint"]):
                raise Refused(f"{where}.trials[{j}].fingerprint is not 64 lowercase hex digits")


def open_envelope(env, key, key_id):
    if list(env.keys()) != ["payload", "payloadType", "signatures"]:
        raise Refused(f"envelope keys are {list(env.keys())}")
    if env["payloadType"] != PAYLOAD_TYPE:
        raise Refused(f"payloadType is {env['payloadType']!r}")
    payload = b64_strict(env["payload"], "the payload")
    sigs = env["signatures"]
    if len(sigs) != 1:
        raise Refused(f"{len(sigs)} signatures, expected 1")
    if sigs[0]["keyid"] != key_id:
        raise Refused(f"key id {sigs[0]['keyid']} is not {key_id}")
    sig = b64_strict(sigs[0]["sig"], "the signature")
    try:
        key.verify(sig, pae(env["payloadType"], payload))
    except InvalidSignature:
        raise Refused("the Ed25519 signature does not verify")
    return payload


def is_sha256_hex(value):
    return (
        isinstance(value, str)
        and len(value) == 64
        and all(c in "0123456789abcdef" for c in value)
    )


def check_link(link):
    """One record's session link on its own: sequence from 1, a previous record digest
    exactly when the sequence is above 1."""
    where = f"session {link['session_id']} call {link['sequence']}"
    previous = link.get("previous_record_sha256")
    if link["sequence"] < 1:
        raise Refused(f"{where}: a session's calls count from 1")
    if link["sequence"] == 1 and previous is not None:
        raise Refused(f"{where}: the first call names a previous record")
    if link["sequence"] > 1 and previous is None:
        raise Refused(f"{where}: names no previous record")
    if previous is not None and not is_sha256_hex(previous):
        raise Refused(f"{where}: previous_record_sha256 is not 64 lowercase hex digits")


SANDBOX_FIELDS = ("provider", "isolation", "evidence_sha256", "environment")


def check_sessions(records):
    """The session chains of a bundle's records (with their line numbers), in order: per
    session, calls 1, 2, 3, ... each naming the previous call's record digest, on one
    provider, tier, evidence digest and environment. Runs outside sessions are passed over.
    A restored or forked session (its link's origin) is a branch: its first call here follows
    its parent's call at the snapshot, whose record must be earlier in the bundle; its origin
    changes only where it was restored under its own id after a daemon restart (from there
    its tier and evidence digest are the restoring daemon's)."""
    present = {
        (rec["session"]["session_id"], rec["session"]["sequence"])
        for _, rec in records
        if rec.get("session") is not None
    }
    chains = {}
    seen = {}
    for number, rec in records:
        link = rec.get("session")
        if link is None:
            continue
        check_call(number, rec, link, present, chains, seen)
        seen[rec["record_sha256"]] = (link["session_id"], link["sequence"])


def check_call(number, rec, link, present, chains, seen):
    """One session call's place in its chain (see check_sessions)."""
    sid, seq = link["session_id"], link["sequence"]
    where = f"line {number}: session {sid} call {seq}"
    chain = chains.get(sid)
    origin = link.get("origin")
    first = origin["parent_calls"] + 1 if origin is not None else 1
    expected = chain["next"] if chain else first
    if seq < expected:
        raise Refused(f"{where}: repeated (calls 1 to {expected - 1} came before)")
    if seq > expected:
        if (sid, expected) in present:
            raise Refused(f"{where}: out of order (call {expected} comes after it)")
        if chain is None:
            raise Refused(f"{where}: the session's first call here is not call {first}")
        raise Refused(f"{where}: calls {expected} to {seq - 1} are missing")
    if chain is None:
        if origin is not None:
            parent = origin.get("parent_record_sha256")
            hangs = link.get("previous_record_sha256") == parent and (
                parent is None
                or seen.get(parent) == (origin["parent_session_id"], origin["parent_calls"])
            )
            if not hangs:
                raise Refused(
                    f"{where}: a branch of session {origin['parent_session_id']} whose "
                    "parent record is not earlier in the bundle"
                )
        chains[sid] = {
            "next": seq + 1,
            "last": rec["record_sha256"],
            "origin": origin,
            "first": {f: rec[f] for f in SANDBOX_FIELDS},
        }
        return
    if link.get("previous_record_sha256") != chain["last"]:
        raise Refused(
            f"{where}: names {link.get('previous_record_sha256')} as the previous record, "
            f"but call {seq - 1} has {chain['last']}"
        )
    if origin != chain["origin"]:
        restored_here = (
            origin is not None
            and origin["start"] == "restored"
            and origin["parent_session_id"] == sid
            and origin["parent_calls"] + 1 == seq
            and origin.get("parent_record_sha256") == chain["last"]
        )
        if not restored_here:
            raise Refused(f"{where}: its origin differs from the session's")
        chain["origin"] = origin
        chain["first"]["isolation"] = rec["isolation"]
        chain["first"]["evidence_sha256"] = rec["evidence_sha256"]
    for field in SANDBOX_FIELDS:
        if rec[field] != chain["first"][field]:
            raise Refused(f"{where}: {field} differs from the session's first call")
    chain["next"] += 1
    chain["last"] = rec["record_sha256"]


def check_bundle(data, key, key_id):
    if not data:
        raise Refused("empty bundle")
    if not data.endswith(b"\n"):
        raise Refused("the bundle does not end with a newline")
    lines = data[:-1].split(b"\n")
    previous = GENESIS
    entries = 0
    closed = False
    records = []
    for number, raw in enumerate(lines, start=1):
        where = f"line {number} (expected sequence {entries})"
        try:
            if closed:
                raise Refused("a line after the close")
            try:
                line = loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise Refused(f"not JSON: {e}")
            if not isinstance(line, dict) or canonical(line) != raw:
                raise Refused("not in canonical form")
            if set(line.keys()) - {"exchange", "envelope"}:
                raise Refused(f"unexpected keys {sorted(line.keys())}")
            payload = open_envelope(line["envelope"], key, key_id)
            st = loads(payload.decode("utf-8"))
            if st.get("_type") != STATEMENT_TYPE:
                raise Refused(f"_type is {st.get('_type')!r}")
            if len(st["subject"]) != 1:
                raise Refused("not exactly one subject")
            subject = st["subject"][0]
            pred = st["predicate"]
            if pred["sequence"] != entries:
                raise Refused(f"sequence {pred['sequence']}, expected {entries}")
            if pred["previous_sha256"] != previous:
                raise Refused(
                    f"names {pred['previous_sha256']} as predecessor, expected {previous}"
                )
            if st["predicateType"] == RUN_TYPE:
                ex = line.get("exchange")
                if ex is None:
                    raise Refused("an entry without its exchange")
                if pred["exchange_sha256"] != sha256_hex(canonical(ex)):
                    raise Refused("exchange_sha256 does not match the stored exchange")
                req, resp = ex["request"], ex["response"]
                rec = resp["record"]
                rec_sha = record_sha256(rec)
                if rec_sha != rec["record_sha256"]:
                    raise Refused(
                        f"record digest recomputed {rec_sha}, stored {rec['record_sha256']}"
                    )
                if subject != {"name": "run:" + req["request_id"], "digest": {"sha256": rec_sha}}:
                    raise Refused(f"subject {subject} does not match the record")
                for field in ("request_sha256", "result_sha256"):
                    if not (pred[field] == resp[field] == rec[field]):
                        raise Refused(f"{field} differs between statement, response and record")
                for field in ("provider", "isolation", "evidence_sha256", "environment"):
                    if pred[field] != rec[field]:
                        raise Refused(f"{field} differs between statement and record")
                if pred["request_id"] != req["request_id"] or resp["request_id"] != req["request_id"]:
                    raise Refused("request_id differs")
                if rec.get("session") is not None:
                    check_link(rec["session"])
                check_trials(rec)
                records.append((number, rec))
                entries += 1
            elif st["predicateType"] == CLOSE_TYPE:
                if "exchange" in line:
                    raise Refused("the close carries an exchange")
                if pred["entries"] != entries or pred["last_entry_sha256"] != previous:
                    raise Refused(
                        f"the close says {pred['entries']} entries ending {pred['last_entry_sha256']}, "
                        f"found {entries} ending {previous}"
                    )
                if subject != {"name": "bundle-close", "digest": {"sha256": previous}}:
                    raise Refused("the close's subject is not the last entry")
                closed = True
            else:
                raise Refused(f"unknown predicateType {st['predicateType']!r}")
            previous = sha256_hex(canonical(line["envelope"]))
        except Refused as e:
            raise Refused(f"{where}: {e}")
        except (KeyError, TypeError, AttributeError) as e:
            raise Refused(f"{where}: malformed ({type(e).__name__}: {e})")
    try:
        check_sessions(records)
    except (KeyError, TypeError, AttributeError) as e:
        raise Refused(f"a session link is malformed ({type(e).__name__}: {e})")
    if not closed:
        raise Refused(f"no close after {entries} entries")
    return entries


def read_text(path):
    with open(path, "rb") as f:
        data = f.read()
    return data[:-1] if data.endswith(b"\n") else data


def check_golden(directory):
    key, key_id = load_public(os.path.join(directory, "public.pem"))
    want_id = read_text(os.path.join(directory, "key_id")).decode()
    if key_id != want_id:
        raise Refused(f"key id of public.pem is {key_id}, the vector says {want_id}")
    for name in ("entry", "close"):
        statement = read_text(os.path.join(directory, f"{name}.statement.json"))
        want_pae = read_text(os.path.join(directory, f"{name}.pae.hex")).decode()
        got_pae = pae(PAYLOAD_TYPE, statement).hex()
        if got_pae != want_pae:
            raise Refused(f"{name}: PAE computed here differs from {name}.pae.hex")
        sig = bytes.fromhex(read_text(os.path.join(directory, f"{name}.sig.hex")).decode())
        try:
            key.verify(sig, bytes.fromhex(want_pae))
        except InvalidSignature:
            raise Refused(f"{name}: {name}.sig.hex does not verify over the PAE")
    with open(os.path.join(directory, "bundle.jsonl"), "rb") as f:
        entries = check_bundle(f.read(), key, key_id)
    # A session of three calls with a plain run between; then the same calls reordered
    # (1, 3, 2) and signed with the same key: each line checks, the session chain does not.
    with open(os.path.join(directory, "session.jsonl"), "rb") as f:
        check_bundle(f.read(), key, key_id)
    with open(os.path.join(directory, "session-reordered.jsonl"), "rb") as f:
        reordered = f.read()
    try:
        check_bundle(reordered, key, key_id)
    except Refused as e:
        if "out of order" not in str(e):
            raise Refused(f"session-reordered.jsonl refused for another reason: {e}")
    else:
        raise Refused("session-reordered.jsonl (calls 1, 3, 2) was accepted")
    check_trial_bundle()
    return key_id, entries


# A bundle holding a record of two trial steps (record fields 12 and 13), signed by
# `plimsoll-attest sign` with a key made for it (TRIAL_KEY, the public half), then closed.
# Its one exchange is synthetic (a project of two trial steps; its request, result and record
# digests computed, and checked again by `sign`): its scores are numbers JSON writers spell
# differently (1e-7, 0.00001, 1e+21, 1.2345678901234568e+20, 3.0, -0.0, 5e-324), as
# serde_json writes them in the signed line; one trial has no score, one no scenario, one a
# controller's fault, one a scenario name that is not ASCII.
TRIAL_KEY = b"""-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEA7wvqdrS/imf+jSy8c/ZKlQERyf2SWgNhFhFx9R2Yv4Y=
-----END PUBLIC KEY-----
"""
TRIAL_BUNDLE = r'''{"exchange":{"request":{"protocol":1,"request_id":"trial-scores-0001","minimum_isolation":"container","run":{"kind":"project","files":[{"path":"c.py","content":"print(0.5)\n","executable":false},{"path":"c.js","content":"console.log(1)\n","executable":false}],"steps":[{"run":"plimsoll-trial-runner --simulator tank --scenario a.json --trajectory a.bin --scenario b.json --trajectory b.bin -- python3 c.py"},{"run":"plimsoll-trial-runner --simulator motor --scenario m.json --trajectory m.bin --reproducible -- node c.js"}],"artifacts":[]}},"response":{"protocol":1,"request_id":"trial-scores-0001","provider":"crun","isolation":"container","duration_ms":21,"request_sha256":"9924ad1b83e0e22450c2f9fdb90f06308a181b6277790f2838f7cefb4f903ef5","result_sha256":"d4e0c3fca4cebb3ae8492eea110a659e766896cb268009c4b3a991824b72bf81","result":{"exit_code":1,"timed_out":false,"oom_killed":false,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false,"steps":[{"exit_code":1,"timed_out":false,"oom_killed":false,"stdout":"verdict 1\n","stdout_truncated":false,"stderr":"","stderr_truncated":false,"duration_ms":5},{"exit_code":0,"timed_out":false,"oom_killed":false,"stdout":"verdict 2\n","stdout_truncated":false,"stderr":"","stderr_truncated":false,"duration_ms":6}]},"record":{"request_id":"trial-scores-0001","request_sha256":"9924ad1b83e0e22450c2f9fdb90f06308a181b6277790f2838f7cefb4f903ef5","result_sha256":"d4e0c3fca4cebb3ae8492eea110a659e766896cb268009c4b3a991824b72bf81","provider":"crun","isolation":"container","minimum_isolation":"container","evidence_sha256":"649c1cd37753d7f8a774cb1d9f9a4a1f1e5ec1041b723473fe5c39c71d8ff8a7","environment":"sha256:0920dfcfe64ac23225882f551fccc5cf0e014e41521caff05e3ed6d47bb2a22a","started_unix_ms":1765000000000,"ended_unix_ms":1765000000020,"image":{"name":"sandbox","identity":"sha256:0920dfcfe64ac23225882f551fccc5cf0e014e41521caff05e3ed6d47bb2a22a"},"trials":[{"step":0,"simulator":{"name":"tank","version":"1.0.0","sha256":"13c2223554b98ae11287cb35162fe29ff453cd14372bf1d41080fa784d3410c8"},"pass":false,"trials":[{"scenario":"a","end":"completed","ticks":10,"score":1e-7,"pass":true,"fingerprint":"658cca36b702e2d1c4719622af9e925a632685eb4ed14f7c5d3c45f190522d94"},{"end":"failed","reason":"the tank overflowed at tick 3","ticks":3,"score":-0.0,"pass":false,"fingerprint":"95983d351df1032fcd0fe8b64f859f903444a59b1e41c66210f0e2b9b96cd1f0"},{"end":"controller_timeout","reason":"no answer within 100 ms at tick 0","ticks":0,"pass":false,"fingerprint":"ac9482e23d0706c9f6955b2c3ad71151a8cfd24173091600b937e54114d03922"},{"scenario":"é","end":"completed","ticks":5,"score":0.00001,"pass":true,"fingerprint":"acb477c4269dea4b2f24a90568beee8baac96e98308eeff21d8bf235332ffdb0"},{"end":"completed","ticks":5,"score":5e-324,"pass":true,"fingerprint":"9fbeec647dc5549a0a34795d2366075ea9b859425b4fd01320fa692d7d183827"},{"end":"completed","ticks":5,"score":1.7976931348623157e+308,"pass":true,"fingerprint":"f648da6a3d9c679b550acc6234cfa5fdab49248c5a3d0f491eeb0a7b57accbfa"},{"end":"completed","ticks":5,"score":1e+16,"pass":true,"fingerprint":"7f34e8b679b2eb9873ea52c72c7a822155e6a1f1614af448962a17f1f99a8862"},{"end":"completed","ticks":5,"score":1.2345678901234568e+20,"pass":true,"fingerprint":"318b526b70a8fc2a8972948b06911cf4a648bbe85883040cfd5c4ca611530748"},{"end":"completed","ticks":5,"score":3.0,"pass":true,"fingerprint":"dda7ef9ab54ec21a1f32f78ccebb4fe45aa1bc262d03771db09b28d4e9bdbdd5"}]},{"step":1,"simulator":{"name":"motor","version":"1.0.0","sha256":"02983856320b180ca3332cff530e4942f51b9eb9c0f58b806df6c4897148b687"},"pass":true,"trials":[{"scenario":"m","end":"completed","ticks":7,"score":1e+21,"pass":true,"fingerprint":"ebf504cfbbb358a53a493f38d74423798fe021f238b20b32a735a3c68988a12f"},{"end":"completed","ticks":7,"score":0.1,"pass":true,"fingerprint":"71b6d0ff86abab989508c5de27a0ba293c71236d7a7573005365eda624300be6"}]}],"record_sha256":"9c71ca8376984f1fe35ef7b8d25452518ac804271b18403bc8f17588b179c6aa"}}},"envelope":{"payload":"eyJfdHlwZSI6Imh0dHBzOi8vaW4tdG90by5pby9TdGF0ZW1lbnQvdjEiLCJzdWJqZWN0IjpbeyJuYW1lIjoicnVuOnRyaWFsLXNjb3Jlcy0wMDAxIiwiZGlnZXN0Ijp7InNoYTI1NiI6IjljNzFjYTgzNzY5ODRmMWZlMzVlZjdiOGQyNTQ1MjUxOGFjODA0MjcxYjE4NDAzYmM4ZjE3NTg4YjE3OWM2YWEifX1dLCJwcmVkaWNhdGVUeXBlIjoidXJuOnBsaW1zb2xsOmF0dGVzdDpydW46djEiLCJwcmVkaWNhdGUiOnsic2VxdWVuY2UiOjAsInByZXZpb3VzX3NoYTI1NiI6IjAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAiLCJyZXF1ZXN0X2lkIjoidHJpYWwtc2NvcmVzLTAwMDEiLCJyZXF1ZXN0X3NoYTI1NiI6Ijk5MjRhZDFiODNlMGUyMjQ1MGMyZjlmZGI5MGYwNjMwOGExODFiNjI3Nzc5MGYyODM4ZjdjZWZiNGY5MDNlZjUiLCJyZXN1bHRfc2hhMjU2IjoiZDRlMGMzZmNhNGNlYmIzYWU4NDkyZWVhMTEwYTY1OWU3NjY4OTZjYjI2ODAwOWM0YjNhOTkxODI0YjcyYmY4MSIsInByb3ZpZGVyIjoiY3J1biIsImlzb2xhdGlvbiI6ImNvbnRhaW5lciIsImV2aWRlbmNlX3NoYTI1NiI6IjY0OWMxY2QzNzc1M2Q3ZjhhNzc0Y2IxZDlmOWE0YTFmMWU1ZWMxMDQxYjcyMzQ3M2ZlNWMzOWM3MWQ4ZmY4YTciLCJlbnZpcm9ubWVudCI6InNoYTI1NjowOTIwZGZjZmU2NGFjMjMyMjU4ODJmNTUxZmNjYzVjZjBlMDE0ZTQxNTIxY2FmZjA1ZTNlZDZkNDdiYjJhMjJhIiwiZXhjaGFuZ2Vfc2hhMjU2IjoiMzM0ZjQ0Zjc3NTQwZWQ1NmJhNWQyNTFiODBlMDliZDBlOWFjMWJkNjljNDU3OTcyOGY3MjA0YjcyNzI5YmNlMCJ9fQ==","payloadType":"application/vnd.in-toto+json","signatures":[{"keyid":"fecf79cfb5f14114f3192969f911f038cfdc954a55ee06276b6f58f67a7d296a","sig":"0J78q5AZXt48zWy0VdOKbBmBu/frZQLELjlEhfrCG96y5rPuGDs9xLuaoAxZLKsflcRdDSJqXTTWzAOT70ikBQ=="}]}}
{"envelope":{"payload":"eyJfdHlwZSI6Imh0dHBzOi8vaW4tdG90by5pby9TdGF0ZW1lbnQvdjEiLCJzdWJqZWN0IjpbeyJuYW1lIjoiYnVuZGxlLWNsb3NlIiwiZGlnZXN0Ijp7InNoYTI1NiI6IjgzNTJkNGQ5MzY5YmU2NjEwMDNmM2VjNmExYjhiMWZmMzNkZDc0NTZjODU0MDkyMzkzODY1NmY0YjcxMTMwM2IifX1dLCJwcmVkaWNhdGVUeXBlIjoidXJuOnBsaW1zb2xsOmF0dGVzdDpjbG9zZTp2MSIsInByZWRpY2F0ZSI6eyJzZXF1ZW5jZSI6MSwicHJldmlvdXNfc2hhMjU2IjoiODM1MmQ0ZDkzNjliZTY2MTAwM2YzZWM2YTFiOGIxZmYzM2RkNzQ1NmM4NTQwOTIzOTM4NjU2ZjRiNzExMzAzYiIsImVudHJpZXMiOjEsImxhc3RfZW50cnlfc2hhMjU2IjoiODM1MmQ0ZDkzNjliZTY2MTAwM2YzZWM2YTFiOGIxZmYzM2RkNzQ1NmM4NTQwOTIzOTM4NjU2ZjRiNzExMzAzYiJ9fQ==","payloadType":"application/vnd.in-toto+json","signatures":[{"keyid":"fecf79cfb5f14114f3192969f911f038cfdc954a55ee06276b6f58f67a7d296a","sig":"T7Bx/mnwUAj8124AbaCStGQo/xAM290J+q5yP6kUfGSr6KugzzAvafoUNVS/o18ze51IYPPdL9FLJwUk23SCAQ=="}]}}
'''


def check_trial_bundle():
    """The trial bundle checks; each score re-spelt the way another writer would is
    refused (the signed exchange_sha256 pins the bytes); a score's sign is in the record
    digest; a number with more digits than it needs is refused."""
    key, key_id = public_key(TRIAL_KEY, "TRIAL_KEY")
    data = TRIAL_BUNDLE.encode("utf-8")
    if check_bundle(data, key, key_id) != 1:
        raise Refused("the trial bundle: not one entry")
    entry = loads(data.split(b"\n")[0].decode("utf-8"))
    rec = entry["exchange"]["response"]["record"]
    if [len(s["trials"]) for s in rec["trials"]] != [9, 2] or rec.get("image") is None:
        raise Refused("the trial bundle: not the record of two trial steps in an image")
    for written, other in (("1e-7", "1e-07"), ("0.00001", "1e-05"), ("1e+21", "1e21"), ("3.0", "3")):
        spelt = data.replace(b'"score":%s,' % written.encode(), b'"score":%s,' % other.encode(), 1)
        if spelt == data:
            raise Refused(f"the trial bundle has no score written {written}")
        try:
            check_bundle(spelt, key, key_id)
        except Refused as e:
            if "exchange_sha256" not in str(e):
                raise Refused(f"the trial bundle with {other} for {written}: refused otherwise: {e}")
        else:
            raise Refused(f"the trial bundle with {other} for {written} was accepted")
    negative = rec["trials"][0]["trials"][1]
    if negative["score"].text != "-0.0":
        raise Refused("the trial bundle: its second trial's score is not -0.0")
    negative["score"] = 0
    if record_sha256(rec) == rec["record_sha256"]:
        raise Refused("a score of 0 digests as -0.0")
    try:
        loads('{"score":0.1000000000000000055511151231257827}')
    except Refused:
        pass
    else:
        raise Refused("a score written with more digits than it needs was taken")


def main(argv):
    try:
        if len(argv) == 4 and argv[1] == "bundle":
            key, key_id = load_public(argv[2])
            with open(argv[3], "rb") as f:
                entries = check_bundle(f.read(), key, key_id)
            print(f"attest_check: OK: {entries} entries and a close, key {key_id}")
        elif len(argv) == 3 and argv[1] == "golden":
            key_id, entries = check_golden(argv[2])
            print(
                f"attest_check: OK: golden vectors (key {key_id}, bundle of {entries} entries), "
                "and the trial bundle"
            )
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Refused as e:
        print(f"REFUSED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
