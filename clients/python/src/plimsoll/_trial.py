"""Trials (docs/simulators.md, docs/trials.md): a controller against a simulator its image
carries, sent as a project of one trial step: the request ``plimsoll trial`` builds
(crates/cli/src/trial.rs), so every client and the CLI send the same bytes for the same trial.
"""

from __future__ import annotations

import string
from typing import Optional, Sequence

from ._types import File, Project

TRIAL_RUNNER = "plimsoll-trial-runner"
"""The first word of a trial step."""

# The runner's words are plain: a trial step is not run by a shell (docs/trials.md), so a file
# name with anything else could not be passed to it. No `/`: a name is one file in /work.
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "-_.,:=+@%")
_SIMULATOR_FIRST = frozenset(string.ascii_lowercase + string.digits)
_SIMULATOR_REST = _SIMULATOR_FIRST | frozenset("._-")
_HEX = frozenset("0123456789abcdef")

# The interpreter that runs a controller, by its extension (as the CLI reads it).
_INTERPRETERS = {"js": "node", "mjs": "node", "cjs": "node", "py": "python3"}


def _plain_name(what: str, name: object) -> str:
    # A leading `-` would make the name read as one of the runner's options.
    if (
        not isinstance(name, str)
        or not name
        or name.startswith("-")
        or any(c not in _NAME_CHARS for c in name)
    ):
        raise ValueError(
            f"{what} {name!r}: a trial's file name may hold only letters, digits and "
            "-_.,:=+@% and not start with - (rename it)"
        )
    return name


def _interpreter(name: str) -> str:
    # As Rust's Path::extension reads it: after the last dot, none when nothing precedes it.
    before, dot, ext = name.rpartition(".")
    interpreter = _INTERPRETERS.get(ext) if dot and before else None
    if interpreter is None:
        raise ValueError(
            f"controller {name!r}: name a .js file (run by node) or a .py file (run by python3)"
        )
    return interpreter


def _milliseconds(what: str, value: Optional[int]) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise ValueError(f"{what} must be a whole number of milliseconds, not {value!r}")
    return value


def trial_project(
    simulator: str,
    controller: File,
    scenarios: Sequence[File],
    *,
    simulator_sha256: Optional[str] = None,
    first_deadline_ms: Optional[int] = None,
    tick_deadline_ms: Optional[int] = None,
    reproducible: bool = False,
) -> Project:
    """The project of a trial: ``controller`` and each of ``scenarios`` as files named by their
    ``path`` (a plain file name), one ``plimsoll-trial-runner`` step naming ``simulator`` (and
    the SHA-256 its module must have), each scenario with its trajectory (the scenario's name
    with ``.json`` replaced by ``.bin``), and the trajectories as the artifacts, in the
    scenarios' order. Raises ``ValueError`` for what the runner could not take: a name with a
    character its words cannot carry, two files of one name, a controller that is neither
    JavaScript (``.js``, ``.mjs``, ``.cjs``) nor Python (``.py``), no scenario."""
    if (
        not isinstance(simulator, str)
        or not 0 < len(simulator) <= 64
        or simulator[0] not in _SIMULATOR_FIRST
        or any(c not in _SIMULATOR_REST for c in simulator)
    ):
        raise ValueError(
            f"simulator {simulator!r}: a simulator name matches [a-z0-9][a-z0-9._-]{{0,63}} "
            "(providers().images lists each image's simulators)"
        )
    if not isinstance(controller, File):
        raise ValueError("controller must be a File (its name and its code)")
    if isinstance(scenarios, (File, str, bytes)) or not scenarios:
        raise ValueError("scenarios must be a non-empty list of Files: a trial needs one")
    name = _plain_name("controller", controller.path)
    interpreter = _interpreter(name)
    words = [TRIAL_RUNNER, "--simulator", simulator]
    if simulator_sha256 is not None:
        if (
            not isinstance(simulator_sha256, str)
            or len(simulator_sha256) != 64
            or any(c not in _HEX for c in simulator_sha256)
        ):
            raise ValueError(
                f"simulator_sha256 must be 64 lowercase hex digits, not {simulator_sha256!r}"
            )
        words += ["--simulator-sha256", simulator_sha256]
    names = {name}
    trajectories: list[str] = []
    for scenario in scenarios:
        if not isinstance(scenario, File):
            raise ValueError(f"scenario {scenario!r} is not a File (its name and its JSON)")
        s = _plain_name("scenario", scenario.path)
        if s in names:
            raise ValueError(f"scenario {s!r}: another file of the trial is named {s}; rename one")
        names.add(s)
        trajectory = (s[: -len(".json")] if s.endswith(".json") else s) + ".bin"
        if trajectory in names:
            raise ValueError(
                f"scenario {s!r}: its trajectory {trajectory} would overwrite another file of "
                "the trial; rename one"
            )
        names.add(trajectory)
        trajectories.append(trajectory)
        words += ["--scenario", s, "--trajectory", trajectory]
    for flag, value in (
        ("--first-deadline-ms", _milliseconds("first_deadline_ms", first_deadline_ms)),
        ("--tick-deadline-ms", _milliseconds("tick_deadline_ms", tick_deadline_ms)),
    ):
        if value is not None:
            words += [flag, str(value)]
    if reproducible:
        words.append("--reproducible")
    words += ["--", interpreter, name]
    return Project(
        steps=[" ".join(words)],
        files=[controller, *scenarios],
        artifacts=trajectories,
    )
