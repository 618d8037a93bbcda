"""The HTTP details both clients and their sessions share: the httpx options (no proxy from
the environment, a fresh connection per exchange, no redirects), timeouts, capped reading of
answers, and which failures prove that nothing was sent."""

from __future__ import annotations

from typing import Any, Iterable

import httpx

from ._verify import CONNECT_TIMEOUT_S, MAX_ANSWER_BYTES

__version__ = "0.1.0"
USER_AGENT = f"plimsoll-python/{__version__}"

# Failures that can only happen before a byte of the request was written: no connection was
# made (keep-alive is off, so every exchange opens its own), or the URL is unusable.
NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.InvalidURL,
)


class AnswerTooLarge(Exception):
    """An answer over :data:`MAX_ANSWER_BYTES`: read no further."""


# Every way an exchange can fail without an answer (``httpx.InvalidURL`` is no HTTPError).
FAILED = (httpx.HTTPError, httpx.InvalidURL, AnswerTooLarge)


def http_options() -> dict[str, Any]:
    return dict(
        # No proxy or netrc from the environment: a proxy would blur "connection refused"
        # into "may have run", and would see the token.
        trust_env=False,
        # A fresh connection per exchange, so a connect failure proves nothing was sent and a
        # connection the daemon closed while idle is never reused for a run.
        limits=httpx.Limits(max_keepalive_connections=0),
        # Redirects are answers too; a POST is never replayed elsewhere.
        follow_redirects=False,
        headers={"user-agent": USER_AGENT},
    )


def exchange_timeout(budget_s: float) -> httpx.Timeout:
    return httpx.Timeout(budget_s, connect=CONNECT_TIMEOUT_S, pool=CONNECT_TIMEOUT_S)


def _take(out: bytearray, chunk: bytes) -> None:
    out.extend(chunk)
    if len(out) > MAX_ANSWER_BYTES:
        raise AnswerTooLarge(f"the answer is over {MAX_ANSWER_BYTES} bytes")


def read_capped(chunks: Iterable[bytes]) -> bytes:
    out = bytearray()
    for c in chunks:
        _take(out, c)
    return bytes(out)


async def aread_capped(chunks: Any) -> bytes:
    out = bytearray()
    async for c in chunks:
        _take(out, c)
    return bytes(out)


def describe(e: BaseException) -> str:
    """An exception for a message: its type and text."""
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}" if str(e) else text
