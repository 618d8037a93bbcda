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
                                             DIR/session-reordered.jsonl refused

Needs `cryptography` (pip install cryptography). Exits 0 when everything checks; otherwise
prints `REFUSED: line N ...` to stderr and exits 1.
"""

import base64
import binascii
import hashlib
import json
import os
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


def canonical(value):
    """The JSON bytes plimsoll-attest writes: keys in their stored order, no whitespace,
    non-ASCII characters as themselves."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


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
        key = load_pem_public_key(f.read())
    if not isinstance(key, Ed25519PublicKey):
        raise Refused(f"{path} is not an Ed25519 public key")
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
    for name, value in fields:
        out += frame(name.encode()) + frame(value)
    return sha256_hex(out)


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
    provider, tier, evidence digest and environment. Runs outside sessions are passed over."""
    present = {
        (rec["session"]["session_id"], rec["session"]["sequence"])
        for _, rec in records
        if rec.get("session") is not None
    }
    chains = {}
    for number, rec in records:
        link = rec.get("session")
        if link is None:
            continue
        sid, seq = link["session_id"], link["sequence"]
        where = f"line {number}: session {sid} call {seq}"
        chain = chains.get(sid)
        expected = chain["next"] if chain else 1
        if seq < expected:
            raise Refused(f"{where}: repeated (calls 1 to {expected - 1} came before)")
        if seq > expected:
            if (sid, expected) in present:
                raise Refused(f"{where}: out of order (call {expected} comes after it)")
            if chain is None:
                raise Refused(f"{where}: the session's first call here is not call 1")
            raise Refused(f"{where}: calls {expected} to {seq - 1} are missing")
        if chain is None:
            chains[sid] = {
                "next": 2,
                "last": rec["record_sha256"],
                "first": {f: rec[f] for f in SANDBOX_FIELDS},
            }
            continue
        if link.get("previous_record_sha256") != chain["last"]:
            raise Refused(
                f"{where}: names {link.get('previous_record_sha256')} as the previous record, "
                f"but call {seq - 1} has {chain['last']}"
            )
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
                line = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise Refused(f"not JSON: {e}")
            if not isinstance(line, dict) or canonical(line) != raw:
                raise Refused("not in canonical form")
            if set(line.keys()) - {"exchange", "envelope"}:
                raise Refused(f"unexpected keys {sorted(line.keys())}")
            payload = open_envelope(line["envelope"], key, key_id)
            st = json.loads(payload.decode("utf-8"))
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
    return key_id, entries


def main(argv):
    try:
        if len(argv) == 4 and argv[1] == "bundle":
            key, key_id = load_public(argv[2])
            with open(argv[3], "rb") as f:
                entries = check_bundle(f.read(), key, key_id)
            print(f"attest_check: OK: {entries} entries and a close, key {key_id}")
        elif len(argv) == 3 and argv[1] == "golden":
            key_id, entries = check_golden(argv[2])
            print(f"attest_check: OK: golden vectors (key {key_id}, bundle of {entries} entries)")
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Refused as e:
        print(f"REFUSED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
