"""The client behind a real proxy in front of the real plimsolld, which swaps, alters or
downgrades what passes through it: each must be caught, and none may read "nothing ran"."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import plimsoll
from plimsoll import Reason, Tier, not_dispatched_reason

sys.path.insert(0, str(Path(__file__).parent))
from daemon import Daemon  # noqa: E402
from proxy import Proxy  # noqa: E402


def through(proxy: Proxy, daemon: Daemon) -> plimsoll.Client:
    return plimsoll.Client(proxy.url, daemon.token)


def resign_record(v: Any) -> None:
    """Recomputes the record's digest after a rewrite, as a party in the middle would."""
    v["record"]["record_sha256"] = plimsoll.record_sha256(v["record"])


def test_a_proxy_that_swaps_answers_cannot_make_a_run_read_not_dispatched(daemon: Daemon) -> None:
    with Proxy(daemon.url, swap=True) as proxy, through(proxy, daemon) as c:
        outcome: dict[str, BaseException] = {}

        def refused() -> None:
            try:
                c.run_javascript("console.log('refused')", minimum_isolation="vm")
            except BaseException as e:  # noqa: BLE001
                outcome["refused"] = e

        t = threading.Thread(target=refused)
        t.start()
        with pytest.raises(plimsoll.PlimsollError) as ran:
            c.run_javascript("console.log('ran')", minimum_isolation="process")
        t.join(60)
        assert proxy.runs_seen == 2

    # The run that ran got the other's refusal: it must not read "nothing ran".
    assert isinstance(ran.value, plimsoll.UnverifiedRefusal), repr(ran.value)
    assert isinstance(ran.value, plimsoll.MayHaveRun)
    assert not_dispatched_reason(ran.value) is None
    assert ran.value.claimed_reason is Reason.ISOLATION and ran.value.echoed != ran.value.request_id
    assert "may have run" in str(ran.value)
    # The refused one got the other's result: it must not take it as its own.
    other = outcome["refused"]
    assert isinstance(other, plimsoll.RequestIdMismatch), repr(other)
    assert not_dispatched_reason(other) is None


def test_a_proxy_that_changes_one_byte_of_stdout_is_caught(daemon: Daemon) -> None:
    def bump(v: Any) -> None:
        assert v["result"]["stdout"] == "42\n", v
        v["result"]["stdout"] = "43\n"

    with Proxy(daemon.url, response=bump) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.DigestMismatch) as e:
            c.run_javascript("console.log(6 * 7)", minimum_isolation="process")
    assert e.value.kind == "result" and e.value.computed != e.value.claimed
    assert e.value.computed in str(e.value) and e.value.claimed in str(e.value)
    assert not_dispatched_reason(e.value) is None


def test_a_proxy_that_changes_one_byte_of_an_artifact_is_caught(
    daemon: Daemon, container: None
) -> None:
    def flip(v: Any) -> None:
        art = v["result"]["artifacts"][0]
        assert art["content"] == {"base64": "/wA="}, art
        art["content"] = {"base64": "/gA="}

    with Proxy(daemon.url, response=flip) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.DigestMismatch) as e:
            c.run_project(
                ["true"], files=[plimsoll.File("b", b"\xff\x00")], artifacts=["b"],
                minimum_isolation="container",
            )
    assert e.value.kind == "result"


def test_a_proxy_that_changes_the_record_is_caught(daemon: Daemon) -> None:
    def move(v: Any) -> None:
        v["record"]["environment"] = "elsewhere"

    with Proxy(daemon.url, response=move) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.DigestMismatch) as e:
            c.run_python("print(1)", minimum_isolation="process")
    assert e.value.kind == "record"


def test_a_tier_rewritten_below_the_floor_without_recomputing_is_an_evidence_mismatch(
    daemon: Daemon, container: None
) -> None:
    def lower(v: Any) -> None:
        assert v["isolation"] == "container", v
        v["isolation"] = v["record"]["isolation"] = "process"

    with Proxy(daemon.url, response=lower) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.EvidenceMismatch) as e:
            c.run_python("print(1)", minimum_isolation="container")
    assert (e.value.isolation, e.value.floor) == (Tier.PROCESS, Tier.CONTAINER)
    assert "the code ran" in str(e.value) and not_dispatched_reason(e.value) is None


def test_a_tier_rewritten_with_every_digest_recomputed_is_caught_by_the_tier_alone(
    daemon: Daemon, container: None
) -> None:
    def lower(v: Any) -> None:
        v["isolation"] = v["record"]["isolation"] = "process"
        resign_record(v)

    with Proxy(daemon.url, response=lower) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.EvidenceMismatch) as e:
            c.run_python("print(1)", minimum_isolation="container")
        assert e.value.floor is Tier.CONTAINER
        # No floor sent: the daemon's default floor (container, from GET /v1/providers) is the
        # one checked.
        with pytest.raises(plimsoll.EvidenceMismatch) as e:
            c.run_python("print(1)")
        assert (e.value.isolation, e.value.floor) == (Tier.PROCESS, Tier.CONTAINER)
        assert "default floor" in str(e.value)


def test_a_proxy_that_lowers_the_floor_on_the_way_in_is_an_evidence_mismatch(
    daemon: Daemon,
) -> None:
    def lower(v: Any) -> None:
        assert v["minimum_isolation"] == "kernel", v
        v["minimum_isolation"] = "process"

    with Proxy(daemon.url, request=lower) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.EvidenceMismatch) as e:
            c.run_javascript("console.log(1)", minimum_isolation="kernel")
    # The code really ran, at the process tier, below the floor asked for.
    assert e.value.isolation is Tier.PROCESS and e.value.floor is Tier.KERNEL
    assert not_dispatched_reason(e.value) is None


def test_a_record_without_its_applied_floor_is_refused(daemon: Daemon) -> None:
    def drop(v: Any) -> None:
        assert v["record"]["minimum_isolation"] == "process", v
        del v["record"]["minimum_isolation"]
        # Left out of the digest when absent, so recomputing it makes a record that an older
        # daemon could have written: only the applied-floor check catches it.
        resign_record(v)

    with Proxy(daemon.url, response=drop) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.BadResponse) as e:
            c.run_python("print(1)", minimum_isolation="process")
        assert proxy.runs_seen == 1
    assert "states no applied floor (`record.minimum_isolation`)" in str(e.value)
    assert "may have run" in str(e.value)
    assert not_dispatched_reason(e.value) is None

    def null(v: Any) -> None:
        v["record"]["minimum_isolation"] = None
        resign_record(v)

    with Proxy(daemon.url, response=null) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.BadResponse) as e:
            c.run_python("print(1)", minimum_isolation="process")
    assert "states no applied floor" in str(e.value) and not_dispatched_reason(e.value) is None


def test_an_applied_floor_lowered_with_the_record_digest_recomputed_is_a_record_mismatch(
    daemon: Daemon, container: None
) -> None:
    def lower(v: Any) -> None:
        assert v["isolation"] == "container", v
        assert v["record"]["minimum_isolation"] == "container", v
        v["record"]["minimum_isolation"] = "process"
        resign_record(v)

    with Proxy(daemon.url, response=lower) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.RecordMismatch) as e:
            c.run_python("print(1)", minimum_isolation="container")
        assert (e.value.field, e.value.response, e.value.record) == (
            "minimum_isolation",
            "container",
            "process",
        )
        assert "the floor sent" in str(e.value) and not_dispatched_reason(e.value) is None
        # No floor sent: the record's floor must be the daemon's default floor (container,
        # from GET /v1/providers).
        with pytest.raises(plimsoll.RecordMismatch) as e:
            c.run_python("print(1)")
        assert (e.value.field, e.value.response, e.value.record) == (
            "minimum_isolation",
            "container",
            "process",
        )
        assert "default floor" in str(e.value)


def test_an_applied_floor_raised_above_the_tier_is_an_evidence_mismatch(daemon: Daemon) -> None:
    # The record says the daemon held the run to `kernel`, and the process tier answered: the
    # tier is checked against the applied floor before the floor is compared with the one sent,
    # so the run reads "ran below the floor".
    def raise_applied(v: Any) -> None:
        assert v["record"]["minimum_isolation"] == "process", v
        v["record"]["minimum_isolation"] = "kernel"
        resign_record(v)

    with Proxy(daemon.url, response=raise_applied) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.EvidenceMismatch) as e:
            c.run_python("print(1)", minimum_isolation="process")
    assert (e.value.isolation, e.value.floor) == (Tier.PROCESS, Tier.KERNEL)
    assert "record says the daemon applied" in str(e.value)
    assert not_dispatched_reason(e.value) is None


def test_another_provider_than_the_one_named_is_a_provider_mismatch(daemon: Daemon) -> None:
    def rename(v: Any) -> None:
        assert v["provider"] == "process"
        v["provider"] = v["record"]["provider"] = "crun"
        resign_record(v)

    with Proxy(daemon.url, response=rename) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.ProviderMismatch) as e:
            c.run_python("print(1)", minimum_isolation="process", provider="process")
    assert (e.value.asked, e.value.provider) == ("process", "crun")
    assert not_dispatched_reason(e.value) is None and "the code ran" in str(e.value)

    def swap_request(v: Any) -> None:
        v["provider"] = "process"

    with Proxy(daemon.url, request=swap_request) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.ProviderMismatch) as e:
            c.run_python("print(1)", minimum_isolation="process", provider="crun")
    assert (e.value.asked, e.value.provider) == ("crun", "process")


def test_a_response_that_disagrees_with_its_record_is_caught(daemon: Daemon) -> None:
    def stronger(v: Any) -> None:
        v["isolation"] = "vm"

    with Proxy(daemon.url, response=stronger) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.RecordMismatch) as e:
            c.run_python("print(1)", minimum_isolation="process")
    assert e.value.field == "isolation"


def test_a_result_with_another_id_is_not_ours(daemon: Daemon) -> None:
    def other(v: Any) -> None:
        v["request_id"] = "someone-else"

    with Proxy(daemon.url, response=other) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.RequestIdMismatch) as e:
            c.run_python("print(1)", minimum_isolation="process")
    assert e.value.echoed == "someone-else" and not_dispatched_reason(e.value) is None


def test_a_refusal_whose_echo_is_dropped_is_not_honoured(daemon: Daemon) -> None:
    def drop(v: Any) -> None:
        assert v["error"]["not_dispatched"] == "isolation", v
        v["request_id"] = None

    with Proxy(daemon.url, response=drop) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.UnverifiedRefusal) as e:
            c.run_python("print(1)", minimum_isolation="vm")
    assert e.value.echoed is None and not_dispatched_reason(e.value) is None


@pytest.mark.parametrize(
    "name, rewrite",
    [
        ("an unknown member in the result", lambda b: b.replace(b'"result":{', b'"result":{"extra":1,', 1)),
        ("a duplicated member", lambda b: b.replace(b'"result":{', b'"result":{"timed_out":true,', 1)),
        ("a cut-off body", lambda b: b[: len(b) // 2]),
    ],
)
def test_an_unreadable_answer_may_have_run(daemon: Daemon, name: str, rewrite: Any) -> None:
    def compact(b: bytes) -> bytes:
        return rewrite(json.dumps(json.loads(b), separators=(",", ":")).encode())

    with Proxy(daemon.url, raw_response=compact) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.BadResponse) as e:
            c.run_python("print(1)", minimum_isolation="process")
    assert not_dispatched_reason(e.value) is None, name


def test_altered_evidence_in_the_providers_listing_is_caught(daemon: Daemon) -> None:
    def claim(v: Any) -> None:
        ev = v["providers"][0]["evidence"]
        ev["config"]["altered"] = "by the proxy"

    with Proxy(daemon.url, providers_response=claim) as proxy, through(proxy, daemon) as c:
        with pytest.raises(plimsoll.DigestMismatch) as e:
            c.providers()
        assert e.value.kind == "evidence"
        # A run without a floor needs the default floor first: it cannot be read, so the run
        # is not sent at all.
        with pytest.raises(plimsoll.NotDispatched) as nd:
            c.run_python("print(1)")
        assert nd.value.reason is Reason.ENVIRONMENT and proxy.runs_seen == 0
