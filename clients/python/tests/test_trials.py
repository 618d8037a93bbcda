"""Trials against a real plimsolld at crun: the tank of the default image examines its
accepted and failing controllers on a hidden scenario, and a simulator the image lacks is
refused before anything runs. The image's simulators are listed by ``providers()``."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path

import pytest

import plimsoll
from plimsoll import File, Reason, Tier, TrialEnd

sys.path.insert(0, str(Path(__file__).parent))
from daemon import Daemon  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
HIDDEN_1 = File("hidden-1.json", (REPO / "sims/tank/scenarios/hidden-1.json").read_bytes())
# The SHA-256 of the trajectory of the accepted tank controller on hidden-1 (docs/simulators.md):
# the same on every host and tier, whichever language the controller is written in.
ACCEPTED_FINGERPRINT = "f0fe0f868cdd7b2fd62fee9132f4ec5f62ec04980aac34d0ec552f134d1e0e47"
# Generous deadlines: the tests share two cores with everything else.
DEADLINES = dict(first_deadline_ms=20_000, tick_deadline_ms=5_000)


def controller(name: str) -> File:
    return File(name, (REPO / "examples/controllers/tank" / name).read_bytes())


def test_the_default_image_lists_its_simulators(providers: plimsoll.ProvidersResponse) -> None:
    image = providers.default_image
    assert image is not None, providers.images
    assert [s.name for s in image.simulators] == ["cartpole", "tank", "motor"]
    for s in image.simulators:
        assert s.path == f"/opt/plimsoll/simulators/{s.name}.wasm"
        assert len(s.sha256) == 64


def test_the_accepted_tank_controller_passes(
    client: plimsoll.Client, providers: plimsoll.ProvidersResponse, container: None
) -> None:
    res = client.trial(
        "tank",
        controller("accepted.py"),
        [HIDDEN_1],
        reproducible=True,
        minimum_isolation="container",
        **DEADLINES,
    )
    assert res.isolation >= Tier.CONTAINER and res.exit_code == 0, res.result.steps
    assert len(res.record.trials) == 1
    step = res.record.trials[0]
    assert step.step == 0 and step.passed
    assert step.simulator.name == "tank"
    # The simulator the record names is the module the image declares.
    assert res.record.image is not None
    image = providers.image(res.record.image.identity)
    assert image is not None
    declared = image.simulator("tank")
    assert declared is not None and step.simulator.sha256 == declared.sha256
    (trial,) = step.trials
    assert (trial.scenario, trial.end, trial.passed) == ("hidden-1", TrialEnd.COMPLETED, True)
    assert trial.ticks == 1800 and trial.score is not None and trial.score >= 0.75
    # The trajectory is the artifact, and its SHA-256 is the fingerprint.
    (trajectory,) = res.result.artifacts
    assert trajectory.path == "hidden-1.bin" and trajectory.found and not trajectory.truncated
    assert hashlib.sha256(trajectory.content).hexdigest() == trial.fingerprint
    assert trial.fingerprint == ACCEPTED_FINGERPRINT
    # The step the daemon ran is the one plimsoll trial sends.
    assert b'"run":"plimsoll-trial-runner --simulator tank --scenario hidden-1.json' in res.request_body


def test_the_failing_tank_controller_overflows(client: plimsoll.Client, container: None) -> None:
    res = client.trial(
        "tank", controller("failing.py"), [HIDDEN_1], minimum_isolation="container", **DEADLINES
    )
    # A failed exam is a result, not an error: the runner exits 1 and the record says why.
    assert res.exit_code == 1, res.result.steps
    (step,) = res.record.trials
    assert not step.passed
    (trial,) = step.trials
    assert trial.end is TrialEnd.FAILED and not trial.passed
    assert trial.reason is not None and "overflowed" in trial.reason
    (trajectory,) = res.result.artifacts
    assert hashlib.sha256(trajectory.content).hexdigest() == trial.fingerprint


def test_a_simulator_the_image_lacks_is_refused_and_nothing_runs(
    client: plimsoll.Client, container: None
) -> None:
    with pytest.raises(plimsoll.NotDispatched) as e:
        client.trial(
            "boat", controller("accepted.py"), [HIDDEN_1], minimum_isolation="container"
        )
    assert e.value.reason is Reason.ENVIRONMENT
    assert plimsoll.not_dispatched_reason(e.value) is Reason.ENVIRONMENT
    assert not isinstance(e.value, plimsoll.MayHaveRun)
    assert "boat" in str(e.value)


@pytest.mark.asyncio
async def test_async_trials_of_javascript_controllers(daemon: Daemon, container: None) -> None:
    # The JavaScript controllers answer the same numbers as the Python ones: the same
    # trajectories, so the same fingerprint.
    async with plimsoll.AsyncClient(daemon.url, daemon.token) as c:
        accepted, failing = await asyncio.gather(
            c.trial("tank", controller("accepted.js"), [HIDDEN_1], **DEADLINES),
            c.trial("tank", controller("failing.js"), [HIDDEN_1], **DEADLINES),
        )
    assert accepted.isolation >= Tier.CONTAINER
    assert accepted.record.trials[0].passed
    assert accepted.record.trials[0].trials[0].fingerprint == ACCEPTED_FINGERPRINT
    assert b"-- node accepted.js" in accepted.request_body
    assert not failing.record.trials[0].passed
    assert failing.record.trials[0].trials[0].end is TrialEnd.FAILED
