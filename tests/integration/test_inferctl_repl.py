"""`inferctl chat --interactive` in a pseudo-terminal (pexpect) against the real server.

Covers streaming with the tokens/s line, `/reset`, Ctrl-C during an answer (the stream is
closed, the server aborts the request, the REPL returns to its prompt) and `/exit`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pexpect
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]

INFERCTL = str(Path(sys.executable).with_name("inferctl"))
PROMPT = "> "


def _num_running(server_url: str) -> int:
    stats = httpx.get(f"{server_url}/server/stats", timeout=5).json()
    return (
        sum(w["num_running"] + w["num_waiting"] for w in stats["workers"]) + stats["num_in_flight"]
    )


def _wait_idle(server_url: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (num_running := _num_running(server_url)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return num_running


def _spawn(server_url: str, tmp_path: Path, *args: str) -> pexpect.spawn:
    env = {**os.environ, "HOME": str(tmp_path), "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "dumb"}
    argv = ["chat", "--interactive", "--url", server_url, "--temperature", "0", *args]
    return pexpect.spawn(
        INFERCTL, argv, env=env, encoding="utf-8", timeout=30, preexec_fn=_default_sigint
    )


def _default_sigint() -> None:
    """In the child before exec: Ctrl-C as a user's shell gives it. A SIGINT ignored or
    blocked in this test process (by a library, a thread) would otherwise be inherited
    through exec, and the REPL would never see the Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_repl_streams_resets_cancels_and_exits(server_url: str, tmp_path: Path) -> None:
    child = _spawn(server_url, tmp_path, "--max-tokens", "400")
    try:
        child.expect_exact(PROMPT)
        child.sendline("What is the capital of France? Answer in one word.")
        child.expect(r"\[\d+ tokens, [\d.]+ tokens/s\]")
        child.expect_exact(PROMPT)
        child.sendline("/reset")
        child.expect_exact("(history cleared)")
        child.expect_exact(PROMPT)

        question = "Write a very long story about a dragon who learns to cook."
        child.sendline(question)
        child.expect_exact(question)  # the echo
        child.expect(r"\w+ \w+ \w+ \w+")  # the answer is streaming
        assert _num_running(server_url) >= 1
        child.sendintr()
        child.expect_exact("(cancelled")
        child.expect_exact(PROMPT)
        assert _wait_idle(server_url, timeout_s=1.5) == 0  # the server saw the disconnect

        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert (tmp_path / ".cache" / "inferflux" / "history").read_text().count("+") >= 3


def test_ctrl_c_at_the_prompt_exits_cleanly(server_url: str, tmp_path: Path) -> None:
    child = _spawn(server_url, tmp_path)
    try:
        child.expect_exact(PROMPT)
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "Traceback" not in (child.before or "")
