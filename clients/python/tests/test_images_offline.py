"""Images without a daemon: a request's ``image`` (field 7) and a record's (field 12) read and
digested as the golden vectors say, a selector checked before anything is sent, the
providers listing's ``images``, and the re-check that a run, a session and each of its calls
ran in the image named, on synthetic answers whose digests are all right (so that only the
image check can fail them)."""

from __future__ import annotations

import copy
import json
import socket
from typing import Any, Optional

import pytest

import plimsoll
from plimsoll import Snippet, Tier, _session, _verify, not_dispatched_reason
from plimsoll._session import Chain

from test_digest import BY_NAME
from test_sessions_offline import SID, _call, _cell, _info, _verified

IDENTITY = "sha256:" + "5f" * 32
OTHER_IDENTITY = "sha256:" + "6a" * 32
PYTHON_DATA = {"name": "python-data", "identity": IDENTITY}
SANDBOX = {"name": "sandbox", "identity": OTHER_IDENTITY}
TANK = {"name": "tank", "path": "/opt/plimsoll/simulators/tank.wasm", "sha256": "7a" * 32}


# --- the wire ---------------------------------------------------------------------------


def test_the_image_vectors_are_there_and_read() -> None:
    for name in (
        "request/image-by-name",
        "request/image-by-identity",
        "request/every-optional-field-and-image",
        "record/image",
        "record/session-call-image",
    ):
        assert name in BY_NAME, name
    rec = plimsoll.RunRecord.from_wire(BY_NAME["record/image"]["input"])
    assert rec.image is not None and rec.image == plimsoll.ImageRef("python-data", IDENTITY)
    assert rec.image.answers("python-data") and rec.image.answers(IDENTITY)
    assert not rec.image.answers("sandbox")
    call = plimsoll.RunRecord.from_wire(BY_NAME["record/session-call-image"]["input"])
    assert call.session is not None and call.session.sequence == 1 and call.image == rec.image
    assert plimsoll.RunRecord.from_wire(BY_NAME["record/plain"]["input"]).image is None


def test_a_records_image_is_covered_and_read_strictly() -> None:
    v = BY_NAME["record/image"]
    base = copy.deepcopy(v["input"])
    # Absent and null are one: the record without it keeps the digest it always had.
    plain = {k: x for k, x in base.items() if k != "image"}
    assert plimsoll.record_sha256(dict(plain, image=None)) == plimsoll.record_sha256(plain)
    assert plimsoll.record_sha256(plain) != v["sha256"]
    for change in ({"name": "sandbox"}, {"identity": OTHER_IDENTITY}):
        changed = dict(base, image=dict(base["image"], **change))
        assert plimsoll.record_sha256(changed) != v["sha256"]
    for bad, says in (
        (dict(base, image={"name": "python-data"}), "lacks `identity`"),
        (dict(base, image=dict(PYTHON_DATA, tag="latest")), "unknown members: tag"),
        (dict(base, image="python-data"), "not an object"),
        (dict(base, image={"name": 1, "identity": IDENTITY}), "record.image.name is not a string"),
    ):
        with pytest.raises(ValueError, match=says):
            plimsoll.RunRecord.from_wire(bad)


def test_a_request_names_an_image_by_name_or_identity_and_the_digest_covers_it() -> None:
    for vector, image in (
        ("request/image-by-name", "python-data"),
        ("request/image-by-identity", IDENTITY),
    ):
        p = _verify.prepare(Snippet("python", "print(1)"), image=image, request_id="r-1")
        assert p.sent["image"] == image and p.image == image
        assert plimsoll.request_sha256(p.sent) == BY_NAME[vector]["sha256"], vector
    # Named by neither, the request is what it was before images.
    p = _verify.prepare(Snippet("python", "print(1)"), request_id="r-1")
    assert "image" not in p.sent and p.image is None
    assert plimsoll.request_sha256(dict(p.sent, image=None)) == plimsoll.request_sha256(p.sent)


BAD_SELECTORS = [
    "",
    "Sandbox",
    "-sandbox",
    ".x",
    "a b",
    "a/b",
    "a:b",
    "x" * 65,
    "sha256:",
    "sha256:" + "0A" * 32,
    "sha512:" + "0a" * 32,
    "sha256:" + "0a" * 33,
]


@pytest.mark.parametrize("selector", BAD_SELECTORS)
def test_a_selector_that_names_no_image_is_refused_unsent(selector: str) -> None:
    with pytest.raises(plimsoll.InvalidRequest, match="neither an image name") as e:
        _verify.prepare(Snippet("python", "print(1)"), image=selector)
    assert not_dispatched_reason(e.value) is plimsoll.Reason.REQUEST
    with pytest.raises(plimsoll.InvalidRequest, match="neither an image name"):
        _session.prepare_open("python", image=selector)
    # Through a client: nothing connects to a real listener.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with plimsoll.Client(url, "t", default_floor="process") as c:
        with pytest.raises(plimsoll.InvalidRequest):
            c.run_python("print(1)", image=selector)
        with pytest.raises(plimsoll.InvalidRequest):
            c.open_session("python", image=selector)
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


@pytest.mark.parametrize("selector", ["sandbox", "a", "0.1_x-y", "x" * 64, IDENTITY])
def test_names_and_identities_are_taken(selector: str) -> None:
    assert _verify.prepare(Snippet("python", "print(1)"), image=selector).sent["image"] == selector
    p = _session.prepare_open("python", image=selector)
    assert json.loads(p.body)["image"] == selector and p.image == selector


# --- the providers listing --------------------------------------------------------------


def test_the_providers_listing_reads_its_images() -> None:
    listing = {
        "protocol": 1,
        "default_floor": "container",
        "providers": [],
        "images": [
            dict(
                SANDBOX,
                default=True,
                languages=["python", "javascript"],
                vm_disk=True,
                simulators=[
                    {
                        "name": "cartpole",
                        "path": "/opt/plimsoll/simulators/cartpole.wasm",
                        "sha256": "c" * 64,
                    },
                    TANK,
                ],
            ),
            dict(PYTHON_DATA, default=False, languages=["python"]),
        ],
    }
    p = _verify.read_providers(200, json.dumps(listing).encode(), "u")
    assert [m.name for m in p.images] == ["sandbox", "python-data"]
    sandbox, data = p.images
    assert (sandbox.default, sandbox.vm_disk) == (True, True)
    assert sandbox.languages == ["python", "javascript"]
    assert (data.default, data.languages, data.vm_disk) == (False, ["python"], False)
    assert p.image("python-data") is data and p.image(IDENTITY) is data
    assert p.image("nope") is None and p.default_image is sandbox
    # The simulators an image declares, in its index's order; none when left out.
    assert sandbox.simulators == [
        plimsoll.SimulatorEntry("cartpole", "/opt/plimsoll/simulators/cartpole.wasm", "c" * 64),
        plimsoll.SimulatorEntry(**TANK),
    ]
    assert sandbox.simulator("tank") == plimsoll.SimulatorEntry(**TANK)
    assert sandbox.simulator("boat") is None
    assert data.simulators == [] and data.simulator("tank") is None
    for simulators in (None, []):
        listing["images"][1]["simulators"] = simulators
        again = _verify.read_providers(200, json.dumps(listing).encode(), "u")
        assert again.images[1].simulators == []
    del listing["images"][1]["simulators"]
    # A daemon without images: absent, null or empty.
    empty: list[Optional[list[Any]]] = [None, []]
    for images in empty:
        older = dict(listing, images=images)
        assert _verify.read_providers(200, json.dumps(older).encode(), "u").images == []
    del listing["images"]
    none = _verify.read_providers(200, json.dumps(listing).encode(), "u")
    assert none.images == [] and none.default_image is None
    for image, says in (
        (dict(SANDBOX, default=True, languages=["ruby"]), "languages"),
        (dict(SANDBOX, default=True, simulators=[dict(TANK, abi=1)]), "unknown members: abi"),
        (dict(SANDBOX, default=True, simulators=[dict(TANK, sha256="A" * 64)]), "64 lowercase"),
        (dict(SANDBOX, default=True, simulators=[dict(TANK, sha256=None)]), "lacks `sha256`"),
        (dict(SANDBOX, default=True, simulators=[{"name": "tank", "sha256": "0" * 64}]), "path"),
        (dict(SANDBOX, default=True, simulators=[dict(TANK, name=1)]), "name is not a string"),
        (dict(SANDBOX, default=True, simulators=[None]), "simulators\\[0\\] is not an object"),
        (dict(SANDBOX, default=True, simulators={"tank": TANK}), "simulators is not a list"),
        (dict(SANDBOX, default=True, size=1), "unknown members: size"),
        (SANDBOX, "lacks `default`"),
        (dict(SANDBOX, default="yes"), "default is not a boolean"),
    ):
        bad = dict(listing, images=[image])
        with pytest.raises(plimsoll.ProvidersError, match=says):
            _verify.read_providers(200, json.dumps(bad).encode(), "u")


# --- a run's image re-check -------------------------------------------------------------


def _answer(p: _verify.Prepared, image: Optional[dict[str, str]], tier: str = "container") -> bytes:
    """An honest 200 answer to ``p``, its record naming ``image`` (``None``: none), every
    digest computed over it."""
    result = {
        "exit_code": 0,
        "timed_out": False,
        "stdout": "1\n",
        "stdout_truncated": False,
        "stderr": "",
        "stderr_truncated": False,
    }
    record: dict[str, Any] = {
        "request_id": p.request_id,
        "request_sha256": plimsoll.request_sha256(p.sent),
        "result_sha256": plimsoll.result_sha256(result),
        "provider": "crun",
        "isolation": tier,
        "minimum_isolation": tier,
        "evidence_sha256": "e" * 64,
        "environment": image["identity"] if image is not None else "test",
        "started_unix_ms": 1,
        "ended_unix_ms": 2,
    }
    if image is not None:
        record["image"] = image
    record["record_sha256"] = plimsoll.record_sha256(record)
    return json.dumps(
        {
            "protocol": 1,
            "request_id": p.request_id,
            "provider": "crun",
            "isolation": tier,
            "duration_ms": 1,
            "request_sha256": record["request_sha256"],
            "result_sha256": record["result_sha256"],
            "result": result,
            "record": record,
        }
    ).encode()


def _run(image: Optional[str]) -> _verify.Prepared:
    return _verify.prepare(
        Snippet("python", "print(1)"), minimum_isolation="container", image=image
    )


@pytest.mark.parametrize("named", ["python-data", IDENTITY])
def test_a_run_in_the_image_named_verifies(named: str) -> None:
    p = _run(named)
    r = _verify.verify_answer(p, 200, _answer(p, PYTHON_DATA))
    assert r.record.image == plimsoll.ImageRef("python-data", IDENTITY)
    assert r.stdout == b"1\n"


@pytest.mark.parametrize("named", ["python-data", IDENTITY])
@pytest.mark.parametrize("ran", [SANDBOX, None], ids=["another-image", "no-image"])
def test_a_run_in_another_image_or_none_is_an_evidence_mismatch(
    named: str, ran: Optional[dict[str, str]]
) -> None:
    p = _run(named)
    with pytest.raises(plimsoll.ImageMismatch) as e:
        _verify.verify_answer(p, 200, _answer(p, ran))
    err = e.value
    # The code ran: an evidence mismatch, never a refusal.
    assert isinstance(err, plimsoll.MayHaveRun) and not_dispatched_reason(err) is None
    assert err.code == "evidence_mismatch" and err.request_id == p.request_id
    assert err.asked == named
    if ran is None:
        assert err.image is None and "names no image" in str(err)
    else:
        assert err.image == plimsoll.ImageRef("sandbox", OTHER_IDENTITY)
        assert "ran in image `sandbox`" in str(err)
    assert f"`{named}` asked for" in str(err)


def test_a_run_that_names_no_image_takes_whichever_the_daemon_ran() -> None:
    p = _run(None)
    for ran in (PYTHON_DATA, SANDBOX, None):
        _verify.verify_answer(p, 200, _answer(p, ran))


def test_the_image_is_checked_on_a_run_whose_digests_all_match_only() -> None:
    # The same answer with its record's image changed and its digest left stale is a digest
    # mismatch when the request named no image, and an image mismatch when it named one
    # (the image comes before the digests, as the tier does).
    p = _run(None)
    answer = json.loads(_answer(p, PYTHON_DATA))
    answer["record"]["image"] = SANDBOX
    with pytest.raises(plimsoll.DigestMismatch):
        _verify.verify_answer(p, 200, json.dumps(answer).encode())
    named = _run("python-data")
    answer = json.loads(_answer(named, PYTHON_DATA))
    answer["record"]["image"] = SANDBOX
    with pytest.raises(plimsoll.ImageMismatch):
        _verify.verify_answer(named, 200, json.dumps(answer).encode())


# --- a session's ------------------------------------------------------------------------


def _open(image: Optional[str]) -> _session.PreparedOpen:
    p = _session.prepare_open("python", minimum_isolation="container", image=image)
    return _session.PreparedOpen("r-open", p.body, p.language, p.floor, p.provider, p.image)


@pytest.mark.parametrize("named", ["python-data", IDENTITY])
def test_a_session_must_open_in_the_image_named(named: str) -> None:
    p = _open(named)
    assert json.loads(p.body)["image"] == named

    def opened(image: Optional[dict[str, str]]) -> Any:
        info = _session.read_opened(p, 200, json.dumps(_info(image=image)).encode())
        return _session.check_opened(p, info, None)

    assert opened(PYTHON_DATA) is None
    for ran in (SANDBOX, None):
        e = opened(ran)
        assert isinstance(e, plimsoll.ImageMismatch), e
        assert e.code == "evidence_mismatch" and not_dispatched_reason(e) is None
        assert "the session" in str(e) and "closes it" in str(e)
    # Naming none, any image (or none) is taken.
    for ran in (PYTHON_DATA, SANDBOX, None):
        info = _session.read_opened(_open(None), 200, json.dumps(_info(image=ran)).encode())
        assert _session.check_opened(_open(None), info, None) is None
    # The open answer's image is read strictly.
    with pytest.raises(plimsoll.BadResponse):
        _session.read_opened(p, 200, json.dumps(_info(image={"name": "python-data"})).encode())


def _imaged_call(
    p: _verify.Prepared, sequence: int, previous: Optional[str], image: Optional[dict[str, str]]
) -> dict[str, Any]:
    """An honest answer to the session call ``p``, its record naming ``image``."""
    answer = _call(p, sequence, previous)
    if image is not None:
        answer["record"]["image"] = image
    answer["record"]["record_sha256"] = plimsoll.record_sha256(answer["record"])
    return answer


@pytest.mark.parametrize("named", ["python-data", IDENTITY])
def test_every_call_of_a_session_must_run_in_the_image_its_open_named(named: str) -> None:
    info = plimsoll.SessionInfo.from_wire(_info(image=PYTHON_DATA))
    assert info.image == plimsoll.ImageRef("python-data", IDENTITY)
    chain = Chain(info, 0, None, named)
    p1 = _cell()
    r1 = chain.follow(p1, _verified(p1, _imaged_call(p1, 1, None, PYTHON_DATA)))
    assert chain.sequence == 1 and r1.record.image == info.image
    p2 = _cell()
    for ran, says in ((SANDBOX, "ran in image `sandbox`"), (None, "names no image")):
        with pytest.raises(plimsoll.ImageMismatch, match=says) as e:
            chain.follow(p2, _verified(p2, _imaged_call(p2, 2, r1.record.record_sha256, ran)))
        assert e.value.code == "evidence_mismatch" and not_dispatched_reason(e.value) is None
        assert "the session call" in str(e.value)
        # The chain does not move on an answer that failed its check.
        assert (chain.sequence, chain.previous) == (1, r1.record.record_sha256)
    chain.follow(p2, _verified(p2, _imaged_call(p2, 2, r1.record.record_sha256, PYTHON_DATA)))
    assert chain.sequence == 2


def test_a_session_that_named_no_image_holds_its_calls_to_none() -> None:
    chain = Chain(plimsoll.SessionInfo.from_wire(_info()), 0, None)
    p1 = _cell()
    r1 = chain.follow(p1, _verified(p1, _imaged_call(p1, 1, None, SANDBOX)))
    p2 = _cell()
    chain.follow(p2, _verified(p2, _imaged_call(p2, 2, r1.record.record_sha256, None)))
    assert chain.sequence == 2


def test_a_resync_must_show_the_image_of_the_open() -> None:
    chain = Chain(plimsoll.SessionInfo.from_wire(_info(image=PYTHON_DATA)), 0, None, "python-data")
    chain.resync(plimsoll.SessionInfo.from_wire(_info(image=PYTHON_DATA, calls=0)))
    for shown in (SANDBOX, None):
        with pytest.raises(plimsoll.SessionsError, match="image"):
            chain.resync(plimsoll.SessionInfo.from_wire(_info(image=shown)))


def test_the_session_floor_is_still_checked_first() -> None:
    # A call below the session's floor is an EvidenceMismatch from the run's checks before the
    # chain (and its image) is looked at.
    chain = Chain(plimsoll.SessionInfo.from_wire(_info(image=PYTHON_DATA)), 0, None, "python-data")
    p = _cell()
    low = _imaged_call(p, 1, None, None)
    low["isolation"] = low["record"]["isolation"] = "process"
    low["record"]["record_sha256"] = plimsoll.record_sha256(low["record"])
    with pytest.raises(plimsoll.EvidenceMismatch):
        chain.follow(p, _verify.verify_answer(p, 200, json.dumps(low).encode(), Tier.CONTAINER))
