"""An agent tool that wraps a plimsoll run: the function an agent framework would call with
the code its model wrote, answering output plus the isolation tier that actually ran it.

    python examples/agent_tool.py URL TOKEN_FILE 'print(6 * 7)'

prints the tool's answer as JSON. Nothing is retried: a refusal says nothing ran, any other
error says the code may have run, and the agent is told which.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import plimsoll

# The schema an agent framework registers for the tool.
TOOL_SPEC: dict[str, Any] = {
    "name": "run_code",
    "description": (
        "Run Python or JavaScript in a plimsoll sandbox and return its output, exit code and "
        "the isolation tier it ran at. Nothing has network access."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "the program's source"},
            "language": {"type": "string", "enum": ["python", "javascript"]},
        },
        "required": ["code"],
    },
}


def run_code(
    client: plimsoll.Client,
    code: str,
    language: str = "python",
    *,
    minimum_isolation: str = "container",
    timeout_ms: int = 10_000,
) -> dict[str, Any]:
    """Runs ``code`` at ``minimum_isolation`` or stronger and answers what the model needs."""
    try:
        res = client.run_snippet(
            language,
            code,
            minimum_isolation=minimum_isolation,
            limits=plimsoll.Limits(timeout_ms=timeout_ms),
        )
    except plimsoll.NotDispatched as e:
        return {"ran": False, "reason": e.reason.value, "error": e.detail}
    except plimsoll.MayHaveRun as e:
        return {"ran": "unknown", "error": str(e)}
    r = res.result
    return {
        "ran": True,
        "output": r.stdout.text(),
        "stderr": r.stderr.text(),
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "truncated": r.stdout_truncated or r.stderr_truncated,
        "tier": res.isolation.value,
        "provider": res.provider,
        "record_sha256": res.record.record_sha256,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: agent_tool.py URL TOKEN_FILE CODE", file=sys.stderr)
        return 2
    url, token_file, code = argv[1:]
    with open(token_file) as f:
        token = f.read().strip()
    with plimsoll.Client(url, token) as client:
        answer = run_code(client, code)
    print(json.dumps(answer))
    return 0 if answer["ran"] is True else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
