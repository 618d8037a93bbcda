"""Checks docs/openapi.json: a valid OpenAPI 3.1 document (openapi-spec-validator), whose
schemas accept what the daemon accepts and refuse what it refuses before anything runs.

- Every golden vector input (crates/wire/tests/golden/vectors.json), nulls at every optional
  member included, validates against its schema (RunRequest, RunResult, RunRecord, Evidence).
- Every case of tests/openapi/refused.json fails RunRequest, so a schema-driven client fails
  before sending; the Rust tests check the daemon refuses the same cases.
- A result whose `member_age_ms` and `start` disagree (an age without a warm start, a warm
  start without an age) fails RunResult, and so does one whose `wall` or one of whose
  `egress` receipts is malformed.

Run with the project's venv: `make openapi` (scripts/python-env makes it).
"""

import json
import sys
from pathlib import Path

from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

ROOT = Path(__file__).resolve().parents[2]
KIND_SCHEMA = {
    "request": "RunRequest",
    "result": "RunResult",
    "record": "RunRecord",
    "evidence": "Evidence",
}


def main():
    doc = json.loads((ROOT / "docs/openapi.json").read_text())
    validate(doc)
    print("docs/openapi.json: a valid OpenAPI document")

    def validator(name, components=doc["components"]):
        schema = {"$ref": f"#/components/schemas/{name}", "components": components}
        return Draft202012Validator(schema)

    # The golden vectors are digest cases: their limits may be above the default maximums (an
    # operator may allow more), so they are checked against the schemas without them.
    no_maxima = json.loads(json.dumps(doc["components"]))
    for limit in no_maxima["schemas"]["Limits"]["properties"].values():
        limit.pop("maximum", None)

    problems = []
    vectors = json.loads((ROOT / "crates/wire/tests/golden/vectors.json").read_text())["vectors"]
    for v in vectors:
        errors = list(validator(KIND_SCHEMA[v["kind"]], no_maxima).iter_errors(v["input"]))
        if errors:
            problems.append(f"vector {v['name']} is refused by the schema: {errors[0].message}")
    print(f"{len(vectors)} golden vectors checked against their schemas")

    refused = json.loads((ROOT / "tests/openapi/refused.json").read_text())["cases"]
    request = validator("RunRequest")
    for case in refused:
        if request.is_valid(case["body"]):
            problems.append(f"the schema accepts {case['what']}, which the daemon refuses")
    print(f"{len(refused)} refused requests checked against RunRequest")

    # A member age only with a warm start, and always with one (docs/protocol.md, RunResult).
    result = validator("RunResult")
    plain = next(v["input"] for v in vectors if v["name"] == "result/plain")
    malformed = (
        {"member_age_ms": 1},
        {"start": "cold", "member_age_ms": 1},
        {"start": "warm"},
        {"start": "warm", "member_age_ms": None},
        {"start": "hot"},
    )
    for members in malformed:
        if result.is_valid({**plain, **members}):
            problems.append(f"the schema accepts a result with {members}, which is malformed")
    print(f"{len(malformed)} malformed results checked against RunResult")

    # A wall is read strictly: no unknown member, its required members present, ids in range.
    wall = next(v["input"] for v in vectors if v["name"] == "result/wall-container")["wall"]
    bad_walls = (
        {**wall, "extra": 1},
        {k: v for k, v in wall.items() if k != "root_read_only"},
        {**wall, "uid": 2**32},
        {**wall, "cap_eff": "everything"},
        {**wall, "namespaces": [{"name": "net"}]},
        {**wall, "no_new_privs": "yes"},
    )
    for bad in bad_walls:
        if result.is_valid({**plain, "start": "cold", "wall": bad}):
            problems.append(f"the schema accepts a result with the wall {bad}, which is malformed")
    print(f"{len(bad_walls)} malformed walls checked against RunResult")

    # An egress receipt is read strictly too: no unknown member, its required members
    # present and not null, the port a u16, no list item null.
    receipts = next(v["input"] for v in vectors if v["name"] == "result/egress-receipts")["egress"]
    receipt = receipts[0]
    bad_receipts = (
        [{**receipt, "extra": 1}],
        [{k: v for k, v in receipt.items() if k != "start_ms"}],
        [{**receipt, "port": 65536}],
        [{**receipt, "port": None}],
        [{**receipt, "bytes_up": -1}],
        [{**receipt, "rule": None}],
        [{**receipt, "sni": 7}],
        [None],
        {"0": receipt},
    )
    for bad in bad_receipts:
        if result.is_valid({**plain, "egress": bad}):
            problems.append(f"the schema accepts a result with the egress {bad}, which is malformed")
    if not result.is_valid({**plain, "egress": receipts}):
        problems.append("the schema refuses the receipts of result/egress-receipts")
    print(f"{len(bad_receipts)} malformed egress lists checked against RunResult")

    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
