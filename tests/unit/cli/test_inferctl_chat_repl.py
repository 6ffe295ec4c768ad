"""The interactive chat loop over a scripted reader and an httpx MockTransport (SSE)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prompt_toolkit.history import FileHistory, InMemoryHistory

from inferflux.cli.inferctl.chat_repl import ChatRepl, Dialogue, ReplOptions, _history
from tests.fakes.line_reader import FakeLineReader


def _sse(*pieces: str, completion_tokens: int = 2) -> bytes:
    events = [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
    events.append({"choices": [], "usage": {"completion_tokens": completion_tokens}})
    lines = [f"data: {json.dumps(event)}\n\n" for event in events]
    return "".join([*lines, "data: [DONE]\n\n"]).encode()


class Recorder:
    """A MockTransport handler that records request bodies and streams a fixed answer."""

    def __init__(self, status: int = 200) -> None:
        self.bodies: list[dict] = []
        self.status = status

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        if self.status >= 400:
            error = {"error": {"message": "model 'x' not found", "type": "x", "code": None}}
            return httpx.Response(self.status, json=error)
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, content=_sse("Hel", "lo"), headers=headers)


def _run(script, recorder: Recorder, seed=None, model=None) -> tuple[int, Dialogue]:
    client = httpx.Client(transport=httpx.MockTransport(recorder), base_url="http://test")
    dialogue = Dialogue(seed or [])
    repl = ChatRepl(client, dialogue, ReplOptions(model, 16, 0.0), FakeLineReader(script))
    return repl.run(), dialogue


def test_the_dialogue_grows_and_usage_is_requested(capsys: pytest.CaptureFixture[str]) -> None:
    recorder = Recorder()
    seed = [{"role": "system", "content": "Be brief."}]
    code, dialogue = _run(["Hi", "", "Again"], recorder, seed=seed)
    assert code == 0
    assert [m["role"] for m in recorder.bodies[1]["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
    ]
    assert recorder.bodies[0]["stream_options"] == {"include_usage": True}
    assert len(dialogue.turns) == 4
    output = capsys.readouterr().out
    assert output.count("Hello") == 2 and output.count("tokens/s]") == 2


def test_reset_clears_the_history_and_model_switches() -> None:
    recorder = Recorder()
    code, dialogue = _run(["Hi", "/reset", "/model other", "Again"], recorder)
    assert code == 0
    assert len(recorder.bodies[1]["messages"]) == 1
    assert recorder.bodies[1]["model"] == "other" and "model" not in recorder.bodies[0]
    assert len(dialogue.turns) == 2


@pytest.mark.parametrize("end", ["/exit", KeyboardInterrupt, EOFError])
def test_exit_ctrl_c_and_ctrl_d_at_the_prompt_end_with_0(end) -> None:
    recorder = Recorder()
    code, _ = _run([end, "never asked"], recorder)
    assert code == 0 and recorder.bodies == []


def test_an_api_error_keeps_the_repl_going(capsys: pytest.CaptureFixture[str]) -> None:
    code, dialogue = _run(["Hi", "/nope"], Recorder(status=404))
    assert code == 0 and dialogue.turns == []
    captured = capsys.readouterr()
    assert "404: model 'x' not found" in captured.err
    assert "unknown command /nope" in captured.out


def test_history_is_a_file_or_in_memory_when_unwritable(tmp_path: Path) -> None:
    assert isinstance(_history(tmp_path / "cache" / "history"), FileHistory)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert isinstance(_history(blocker / "history"), InMemoryHistory)
