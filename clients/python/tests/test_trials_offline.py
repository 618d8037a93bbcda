"""A record's trial steps (record field 13) without a daemon: read strictly and digested as
the golden vectors say, a score by its IEEE 754 bits, nulls and an empty list as absent."""

from __future__ import annotations

import copy
import struct
from typing import Any

import pytest

import plimsoll
from plimsoll import TrialEnd

from test_digest import BY_NAME

SIM = "d7156572f87f3c557127a511301424f5c8cc718a269bf4274b5e0258d5b6656e"


def _trials(name: str) -> list[Any]:
    return copy.deepcopy(BY_NAME[name]["input"]["trials"])


def test_the_trial_vectors_are_there_and_read() -> None:
    for name in (
        "record/trials",
        "record/trials-nulls",
        "record/trials-two-steps",
        "record/null-trials",
    ):
        assert name in BY_NAME, name
    rec = plimsoll.RunRecord.from_wire(BY_NAME["record/trials"]["input"])
    assert len(rec.trials) == 1
    step = rec.trials[0]
    assert (step.step, step.passed) == (1, False)
    assert step.simulator == plimsoll.SimulatorRef("cartpole", "1.0.0", SIM)
    ok, failed = step.trials
    assert (ok.scenario, ok.end, ok.reason, ok.score, ok.passed) == (
        "standard",
        TrialEnd.COMPLETED,
        None,
        None,
        True,
    )
    assert (failed.scenario, failed.end, failed.ticks, failed.score, failed.passed) == (
        None,
        TrialEnd.FAILED,
        188,
        0.094,
        False,
    )
    assert failed.reason == "the pole fell past 12 degrees"
    # Nulls are absent, at every depth.
    assert plimsoll.RunRecord.from_wire(BY_NAME["record/trials-nulls"]["input"]) == rec
    two = plimsoll.RunRecord.from_wire(BY_NAME["record/trials-two-steps"]["input"])
    assert [s.step for s in two.trials] == [1, 3]
    assert [t.score for t in two.trials[1].trials] == [1.0, 0.0]
    negative_zero = two.trials[1].trials[1].score
    assert negative_zero is not None and struct.pack(">d", negative_zero) == b"\x80" + b"\0" * 7
    assert two.trials[1].trials[1].end.is_controller_fault
    plain = plimsoll.RunRecord.from_wire(BY_NAME["record/null-trials"]["input"])
    assert plain.trials == [] and plain == plimsoll.RunRecord.from_wire(
        BY_NAME["record/image"]["input"]
    )


def test_the_trials_are_covered_and_left_out_when_empty() -> None:
    v = BY_NAME["record/trials"]
    base = copy.deepcopy(v["input"])
    assert plimsoll.record_sha256(base) == v["sha256"]
    # Empty, null and absent are one: the record without trial steps keeps its digest.
    image = BY_NAME["record/image"]["sha256"]
    for empty in ([], None):
        assert plimsoll.record_sha256(dict(base, trials=empty)) == image
    changes: list[tuple[str, Any]] = [
        ("step", 2),
        ("pass", True),
    ]
    for member, value in changes:
        trials = _trials("record/trials")
        trials[0][member] = value
        assert plimsoll.record_sha256(dict(base, trials=trials)) != v["sha256"], member
    for member, value in (
        ("scenario", "standardx"),
        ("end", "failed"),
        ("reason", "why"),
        ("ticks", 1999),
        ("score", 0.0),
        ("pass", False),
        ("fingerprint", "0" * 64),
    ):
        trials = _trials("record/trials")
        trials[0]["trials"][0][member] = value
        assert plimsoll.record_sha256(dict(base, trials=trials)) != v["sha256"], member
    for member in ("name", "version", "sha256"):
        trials = _trials("record/trials")
        trials[0]["simulator"][member] += "x"
        assert plimsoll.record_sha256(dict(base, trials=trials)) != v["sha256"], member
    # A score is its bits: -0.0 is not 0.0, and the integer 1 is the float 1.0.
    trials = _trials("record/trials")
    trials[0]["trials"][1]["score"] = 0.0
    zero = plimsoll.record_sha256(dict(base, trials=trials))
    trials[0]["trials"][1]["score"] = -0.0
    assert plimsoll.record_sha256(dict(base, trials=trials)) != zero
    trials[0]["trials"][1]["score"] = 1
    one = plimsoll.record_sha256(dict(base, trials=trials))
    trials[0]["trials"][1]["score"] = 1.0
    assert plimsoll.record_sha256(dict(base, trials=trials)) == one
    # Reordering the trials changes the digest.
    trials = _trials("record/trials")
    trials[0]["trials"].reverse()
    assert plimsoll.record_sha256(dict(base, trials=trials)) != v["sha256"]


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda s: s.update(extra=1), "unknown members: extra"),
        (lambda s: s.pop("simulator"), "lacks `simulator`"),
        (lambda s: s.update(trials=None), "lacks `trials`"),
        (lambda s: s.update(step=-1), "step is not an integer in range"),
        (lambda s: s.update(step=2**32), "step is not an integer in range"),
        (lambda s: s["simulator"].update(abi=1), "unknown members: abi"),
        (lambda s: s["simulator"].update(sha256="X" * 64), "not 64 lowercase hex"),
        (lambda s: s["trials"][0].update(end="fell"), "not a trial end"),
        (lambda s: s["trials"][0].update(detail="x"), "unknown members: detail"),
        (lambda s: s["trials"][0].update(score="1"), "score is not a number"),
        (lambda s: s["trials"][0].update(score=True), "score is not a number"),
        (lambda s: s["trials"][0].update(score=float("inf")), "not a finite number"),
        (lambda s: s["trials"][0].update(score=10**400), "not a finite number"),
        (lambda s: s["trials"][0].update(fingerprint="f" * 63), "not 64 lowercase hex"),
        (lambda s: s["trials"][0].update(ticks=1.5), "ticks is not an integer"),
        (lambda s: s["trials"].append(None), "is not an object"),
    ],
)
def test_a_records_trials_are_read_strictly(edit: Any, says: str) -> None:
    base = copy.deepcopy(BY_NAME["record/trials"]["input"])
    edit(base["trials"][0])
    with pytest.raises(ValueError, match=says):
        plimsoll.RunRecord.from_wire(base)


def test_a_score_that_is_no_finite_number_cannot_be_digested() -> None:
    base = copy.deepcopy(BY_NAME["record/trials"]["input"])
    for bad in (float("nan"), float("inf"), "0.5", True, 10**400):
        trials = _trials("record/trials")
        trials[0]["trials"][1]["score"] = bad
        with pytest.raises(ValueError):
            plimsoll.record_sha256(dict(base, trials=trials))
    trials = _trials("record/trials")
    del trials[0]["trials"]
    with pytest.raises(ValueError, match="trials"):
        plimsoll.record_sha256(dict(base, trials=trials))


# --- the trial helper: the request `plimsoll trial` builds --------------------------------


def test_a_trial_is_one_trial_step_with_its_scenarios_and_trajectories() -> None:
    controller = plimsoll.File("c.py", "print(0)\n")
    scenarios = [plimsoll.File("hidden-1.json", "{}"), plimsoll.File("h2.json", b"{}")]
    project = plimsoll.trial_project(
        "tank", controller, scenarios, first_deadline_ms=5000, reproducible=True
    )
    # The step crates/cli/src/trial.rs's test expects for the same trial, word for word.
    assert project.steps == [
        "plimsoll-trial-runner --simulator tank --scenario hidden-1.json --trajectory hidden-1.bin "
        "--scenario h2.json --trajectory h2.bin --first-deadline-ms 5000 --reproducible "
        "-- python3 c.py"
    ]
    assert list(project.files) == [controller, *scenarios]
    assert list(project.artifacts) == ["hidden-1.bin", "h2.bin"]
    wire = project.to_wire()
    assert [f["path"] for f in wire["files"]] == ["c.py", "hidden-1.json", "h2.json"]
    assert wire["artifacts"] == ["hidden-1.bin", "h2.bin"]
    # Every option, and a JavaScript controller; a scenario not named .json keeps its name.
    every = plimsoll.trial_project(
        "motor",
        plimsoll.File("ctl.js", "x"),
        [plimsoll.File("a,b:c=d+e@f%g_h-1.2", "{}")],
        simulator_sha256="0f" * 32,
        first_deadline_ms=0,
        tick_deadline_ms=250,
    )
    assert every.steps == [
        "plimsoll-trial-runner --simulator motor --simulator-sha256 " + "0f" * 32
        + " --scenario a,b:c=d+e@f%g_h-1.2 --trajectory a,b:c=d+e@f%g_h-1.2.bin"
        " --first-deadline-ms 0 --tick-deadline-ms 250 -- node ctl.js"
    ]
    for name in ("c.mjs", "c.cjs"):
        p = plimsoll.trial_project("tank", plimsoll.File(name, "x"), scenarios)
        assert str(p.steps[0]).endswith(f" -- node {name}")


@pytest.mark.parametrize(
    "scenarios, controller, says",
    [
        (["a b.json"], "c.py", "may hold only"),
        (["--uid=0.json"], "c.py", "not start with -"),
        (["s.json"], "-c.py", "not start with -"),
        (["x/s.json"], "c.py", "may hold only"),
        (["s.json"], "c d.py", "may hold only"),
        (["s.json"], "", "may hold only"),
        (["s.json"], "é.py", "may hold only"),
        (["s.json", "s.json"], "c.py", "another file of the trial is named s.json"),
        (["c.py"], "c.py", "another file of the trial is named c.py"),
        (["s.bin.json", "s.bin"], "c.js", "would overwrite"),
        (["s.json"], "c.bin.json", "a .js file"),
        (["s.json"], "c.rb", "a .js file"),
        (["s.json"], ".py", "a .js file"),
        (["s.json"], "py", "a .js file"),
        ([], "c.py", "non-empty list"),
    ],
)
def test_what_the_runner_could_not_take_is_refused_unsent(
    scenarios: list[str], controller: str, says: str
) -> None:
    files = [plimsoll.File(s, "{}") for s in scenarios]
    with pytest.raises(ValueError, match=says):
        plimsoll.trial_project("tank", plimsoll.File(controller, "x"), files)
    # Through a client: an InvalidRequest (not dispatched, reason request), nothing sent: the
    # client's daemon does not exist.
    with plimsoll.Client("http://127.0.0.1:9", "plm_" + "x" * 43) as c:
        with pytest.raises(plimsoll.InvalidRequest, match=says) as e:
            c.trial("tank", plimsoll.File(controller, "x"), files, minimum_isolation="container")
    assert plimsoll.not_dispatched_reason(e.value) is plimsoll.Reason.REQUEST


@pytest.mark.parametrize(
    "options, says",
    [
        (dict(simulator="Tank"), r"\[a-z0-9\]"),
        (dict(simulator=""), r"\[a-z0-9\]"),
        (dict(simulator="t" * 65), r"\[a-z0-9\]"),
        (dict(simulator="tank --sim x"), r"\[a-z0-9\]"),
        (dict(simulator_sha256="xyz"), "64 lowercase hex"),
        (dict(simulator_sha256="A" * 64), "64 lowercase hex"),
        (dict(first_deadline_ms=-1), "whole number of milliseconds"),
        (dict(tick_deadline_ms=1.5), "whole number of milliseconds"),
        (dict(tick_deadline_ms=True), "whole number of milliseconds"),
        (dict(first_deadline_ms=2**64), "whole number of milliseconds"),
    ],
)
def test_a_bad_simulator_or_deadline_is_refused_unsent(options: dict[str, Any], says: str) -> None:
    args: dict[str, Any] = dict(simulator="tank")
    args.update(options)
    with pytest.raises(ValueError, match=says):
        plimsoll.trial_project(
            controller=plimsoll.File("c.py", "x"),
            scenarios=[plimsoll.File("s.json", "{}")],
            **args,
        )
