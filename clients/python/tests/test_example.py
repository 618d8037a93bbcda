"""The agent-tool example, run as a program and called as a function against the real
plimsolld."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import plimsoll

sys.path.insert(0, str(Path(__file__).parent))
from daemon import Daemon  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "agent_tool.py"


def _load():
    spec = importlib.util.spec_from_file_location("agent_tool", EXAMPLE)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_agent_tool_runs_as_a_program(daemon: Daemon, container: None, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(daemon.token)
    p = subprocess.run(
        [sys.executable, str(EXAMPLE), daemon.url, str(token_file), "print(6 * 7)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    answer = json.loads(p.stdout)
    assert answer["ran"] is True and answer["output"] == "42\n" and answer["exit_code"] == 0
    assert answer["tier"] == "container" and answer["provider"] == "crun"
    assert daemon.token not in p.stdout + p.stderr


def test_the_agent_tool_says_what_did_not_run(client: plimsoll.Client) -> None:
    tool = _load()
    assert tool.TOOL_SPEC["name"] == "run_code"
    refused = tool.run_code(client, "print(1)", minimum_isolation="vm")
    assert refused == {"ran": False, "reason": "isolation", "error": refused["error"]}
    assert "floor" in refused["error"]
    ran = tool.run_code(client, "console.log('hi')", "javascript", minimum_isolation="process")
    assert ran["ran"] is True and ran["output"] == "hi\n" and ran["tier"] == "process"
