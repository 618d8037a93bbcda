"""The digest encoding against every golden vector of crates/wire/tests/golden/vectors.json
(read from the repository at test time), and the encoding's rules on values of our own."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import plimsoll
from plimsoll import _digest, _types, _verify

sys.path.insert(0, str(Path(__file__).parent))
from daemon import REPO  # noqa: E402

VECTORS_FILE = REPO / "crates" / "wire" / "tests" / "golden" / "vectors.json"
VECTORS = json.loads(VECTORS_FILE.read_text())["vectors"]
BY_NAME = {v["name"]: v for v in VECTORS}

ENCODERS = {
    "request": _digest.request_encoding,
    "result": _digest.result_encoding,
    "record": _digest.record_encoding,
    "evidence": _digest.evidence_canonical_json,
}
DIGESTS = {
    "request": plimsoll.request_sha256,
    "result": plimsoll.result_sha256,
    "record": plimsoll.record_sha256,
    "evidence": plimsoll.evidence_sha256,
}


def test_there_are_vectors_of_every_kind() -> None:
    assert {v["kind"] for v in VECTORS} == set(ENCODERS), VECTORS_FILE
    assert len(VECTORS) >= 17


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_golden_vector(vector: dict) -> None:
    encoding = ENCODERS[vector["kind"]](vector["input"])
    assert encoding.hex() == vector["encoding_hex"]
    assert DIGESTS[vector["kind"]](vector["input"]) == vector["sha256"]
    if vector["kind"] == "evidence":
        assert encoding.decode("utf-8") == vector["canonical_json"]
    other = vector.get("same_digest_as")
    if other:
        assert BY_NAME[other]["sha256"] == vector["sha256"]


def test_the_request_id_is_not_covered() -> None:
    v = copy.deepcopy(BY_NAME["request/every-optional-field"]["input"])
    before = plimsoll.request_sha256(v)
    v["request_id"] = "another-id"
    assert plimsoll.request_sha256(v) == before
    v["minimum_isolation"] = "vm" if v.get("minimum_isolation") != "vm" else "process"
    assert plimsoll.request_sha256(v) != before


def test_step_durations_are_not_covered_but_outputs_are() -> None:
    v = copy.deepcopy(BY_NAME["result/project"]["input"])
    before = plimsoll.result_sha256(v)
    v["steps"][0]["duration_ms"] += 1000
    assert plimsoll.result_sha256(v) == before
    v["steps"][0]["stdout"] = {"base64": "/w=="}
    assert plimsoll.result_sha256(v) != before


def test_bytes_are_read_strictly() -> None:
    assert _digest.decode_bytes("h\u00e9") == "hé".encode()
    assert _digest.decode_bytes({"base64": "aMOp"}) == "hé".encode()
    for bad in (
        {"base64": "aMOp", "extra": 1},
        {},
        {"base64": "aMO"},  # no padding
        {"base64": "aMN="},  # unused bits set
        {"base64": "aM\nOp"},
        {"base64": "aM-_"},  # url-safe alphabet
        "\ud800",  # a lone surrogate has no UTF-8
        7,
    ):
        with pytest.raises(_digest.EncodingError):
            _digest.decode_bytes(bad)
    assert _digest.encode_bytes(b"\xff\x00") == {"base64": "/wA="}
    assert _digest.encode_bytes("é".encode()) == "é"


def test_evidence_keys_sort_by_utf8_bytes_not_utf16() -> None:
    # U+FF61 sorts before U+1F600 by UTF-8 bytes (and code points); UTF-16 puts it after.
    text = _digest.evidence_canonical_json({"\U0001f600": 1, "\uff61": 2, "a": None})
    assert text.decode() == '{"\uff61":2,"\U0001f600":1}'
    assert _digest.evidence_canonical_json({"k": "\x7f/\x01\n"}) == b'{"k":"\x7f/\\u0001\\n"}'


@pytest.mark.parametrize(
    "name, like",
    [("result/nested-nulls", "result/defaults"), ("record/null-floor", "record/plain")],
)
def test_nulls_at_every_depth_read_as_absent_with_defaults_taken(name: str, like: str) -> None:
    """An answer holding the vector's nulls reads exactly as the one without them: null is
    absent, and a member with a default (``oom_killed``, ``steps``...) takes it."""
    read = (
        plimsoll.RunResult.from_wire if name.startswith("result/") else plimsoll.RunRecord.from_wire
    )
    with_nulls, without = read(BY_NAME[name]["input"]), read(BY_NAME[like]["input"])
    assert with_nulls == without
    if isinstance(with_nulls, plimsoll.RunResult):
        step = with_nulls.steps[0]
        assert with_nulls.oom_killed is False and with_nulls.artifacts == []
        assert (step.name, step.signal, step.oom_killed) == (None, None, False)
        assert (with_nulls.calls[0].route, with_nulls.calls[0].status) == (None, None)
    else:
        assert with_nulls.minimum_isolation is None


def test_the_applied_floor_is_read_and_covered_by_the_record_digest() -> None:
    v = copy.deepcopy(BY_NAME["record/applied-floor"]["input"])
    assert plimsoll.RunRecord.from_wire(v).minimum_isolation is plimsoll.Tier.PROCESS
    before = plimsoll.record_sha256(v)
    v["minimum_isolation"] = "container"
    assert plimsoll.record_sha256(v) != before
    v["minimum_isolation"] = "nope"
    with pytest.raises(ValueError, match="not a tier"):
        plimsoll.RunRecord.from_wire(v)
    # A required member is never null.
    v = copy.deepcopy(BY_NAME["record/plain"]["input"])
    v["isolation"] = None
    with pytest.raises(ValueError, match="lacks `isolation`"):
        plimsoll.RunRecord.from_wire(v)


def test_the_start_and_a_warm_members_age_are_read_and_covered() -> None:
    warm = copy.deepcopy(BY_NAME["result/warm-start"]["input"])
    r = plimsoll.RunResult.from_wire(warm)
    assert (r.start, r.member_age_ms) == (plimsoll.Start.WARM, 1500)
    assert r.start_problem() is None
    before = plimsoll.result_sha256(warm)
    warm["member_age_ms"] += 1
    assert plimsoll.result_sha256(warm) != before
    cold = copy.deepcopy(BY_NAME["result/cold-start"]["input"])
    assert plimsoll.RunResult.from_wire(cold).start is plimsoll.Start.COLD
    assert plimsoll.result_sha256(cold) != BY_NAME["result/plain"]["sha256"]
    cold["start"] = "warm"
    assert plimsoll.result_sha256(cold) != BY_NAME["result/cold-start"]["sha256"]
    # Null is absent: a result written before the members existed.
    old = plimsoll.RunResult.from_wire(BY_NAME["result/null-start"]["input"])
    assert old == plimsoll.RunResult.from_wire(BY_NAME["result/plain"]["input"])
    assert (old.start, old.member_age_ms) == (None, None)
    cold["start"] = "hot"
    with pytest.raises(_digest.EncodingError, match="unknown start"):
        plimsoll.result_sha256(cold)


def test_a_calls_credential_kind_is_read_and_covered() -> None:
    with_kinds = copy.deepcopy(BY_NAME["result/grant-calls-credential"]["input"])
    r = plimsoll.RunResult.from_wire(with_kinds)
    assert [c.credential for c in r.calls] == [
        plimsoll.CredentialKind.STATIC,
        plimsoll.CredentialKind.MINTED,
    ]
    before = plimsoll.result_sha256(with_kinds)
    with_kinds["calls"][0]["credential"] = "minted"
    assert plimsoll.result_sha256(with_kinds) != before
    # Absent and null are the same: a call listed before the member existed.
    del with_kinds["calls"][0]["credential"]
    absent = plimsoll.result_sha256(with_kinds)
    with_kinds["calls"][0]["credential"] = None
    assert plimsoll.result_sha256(with_kinds) == absent != before
    assert plimsoll.RunResult.from_wire(with_kinds).calls[0].credential is None
    with_kinds["calls"][0]["credential"] = "borrowed"
    with pytest.raises(_digest.EncodingError, match="unknown credential kind"):
        plimsoll.result_sha256(with_kinds)
    with pytest.raises(_types.WireError, match="not static or minted"):
        plimsoll.RunResult.from_wire(with_kinds)


def _egress_answer(result: dict, result_sha256: str) -> tuple[_verify.Prepared, bytes]:
    """A 200 answer to a prepared request, carrying ``result`` and claiming
    ``result_sha256`` for it (the vector's stored digest, not one computed here); the
    request's and record's digests are honest."""
    p = _verify.prepare(plimsoll.Snippet("python", "print(1)"), request_id="r-egress")
    record = {
        "request_id": p.request_id,
        "request_sha256": plimsoll.request_sha256(p.sent),
        "result_sha256": result_sha256,
        "provider": "crun",
        "isolation": "container",
        "minimum_isolation": "container",
        "evidence_sha256": "e" * 64,
        "environment": "sha256:" + "1" * 64,
        "started_unix_ms": 1,
        "ended_unix_ms": 2,
    }
    record["record_sha256"] = plimsoll.record_sha256(record)
    answer = {
        "protocol": 1,
        "request_id": p.request_id,
        "provider": "crun",
        "isolation": "container",
        "duration_ms": 700,
        "request_sha256": record["request_sha256"],
        "result_sha256": result_sha256,
        "result": result,
        "record": record,
    }
    return p, json.dumps(answer).encode()


@pytest.mark.parametrize("name", ["result/egress-receipts", "result/egress-receipts-nulls"])
def test_a_result_with_egress_receipts_verifies_against_the_vectors_digest(name: str) -> None:
    vector = BY_NAME[name]
    p, body = _egress_answer(copy.deepcopy(vector["input"]), vector["sha256"])
    r = _verify.verify_answer(p, 200, body, plimsoll.Tier.CONTAINER)
    assert r.result_sha256 == vector["sha256"]
    egress = r.result.egress
    assert [(g.kind, g.verdict) for g in egress] == [
        ("connect", "allowed"),
        ("http", "allowed"),
        ("http", "refused"),
        ("connect", "refused"),
    ]
    assert egress[0] == plimsoll.EgressReceipt(
        host="api.example.com",
        port=443,
        kind="connect",
        address="93.184.215.14:443",
        sni="api.example.com",
        bytes_up=517,
        bytes_down=4821,
        start_ms=112,
        end_ms=348,
        verdict="allowed",
        rule="host *.example.com port 443",
        ended="closed",
    )
    assert egress[1].sni is None and egress[1].rule.endswith(" via 10.0.0.0/8")
    assert (egress[2].address, egress[2].sni, egress[2].ended) == (None, None, None)
    assert egress[3].port == 0


@pytest.mark.parametrize(
    "change",
    [
        lambda g: g[0].update(start_ms=g[0]["start_ms"] + 1),
        lambda g: g[0].update(end_ms=g[0]["end_ms"] + 1),
        lambda g: g[0].update(address="93.184.215.15:443"),
        lambda g: g[0].pop("sni"),
        lambda g: g[2].update(verdict="allowed"),
        lambda g: g[3].update(port=1),
        lambda g: g.reverse(),
        lambda g: g.pop(),
    ],
)
def test_a_changed_egress_receipt_fails_the_vectors_digest(change: Any) -> None:
    """A receipt altered on the way (a time, an address, a verdict, the order, one dropped)
    no longer matches the digest the daemon gave: every member is covered."""
    vector = BY_NAME["result/egress-receipts"]
    result = copy.deepcopy(vector["input"])
    change(result["egress"])
    p, body = _egress_answer(result, vector["sha256"])
    with pytest.raises(plimsoll.DigestMismatch) as e:
        _verify.verify_answer(p, 200, body, plimsoll.Tier.CONTAINER)
    assert e.value.kind == "result" and e.value.claimed == vector["sha256"]
    assert plimsoll.not_dispatched_reason(e.value) is None


def test_egress_receipts_are_read_strictly_and_none_is_the_old_digest() -> None:
    plain = BY_NAME["result/plain"]
    for empty in ([], None):
        assert plimsoll.result_sha256(dict(plain["input"], egress=empty)) == plain["sha256"]
        assert plimsoll.RunResult.from_wire(dict(plain["input"], egress=empty)).egress == []
    receipts = BY_NAME["result/egress-receipts"]["input"]
    for bad, says in (
        ({"extra": 1}, "unknown members: extra"),
        ({"port": 65536}, "port is not an integer in range"),
        ({"port": None}, "lacks `port`"),
        ({"rule": 7}, "rule is not a string"),
        ({"start_ms": -1}, "start_ms is not an integer in range"),
    ):
        result = copy.deepcopy(receipts)
        result["egress"][0].update(bad)
        with pytest.raises(_types.WireError, match=re.escape(says)):
            plimsoll.RunResult.from_wire(result)
    result = copy.deepcopy(receipts)
    result["egress"][0]["port"] = 65536
    with pytest.raises(_digest.EncodingError, match="16-bit"):
        plimsoll.result_sha256(result)
    result["egress"] = [None]
    with pytest.raises(_types.WireError):
        plimsoll.RunResult.from_wire(result)
