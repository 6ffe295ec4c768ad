"""`inferctl chat --interactive`: a REPL that keeps the dialogue and streams each answer.

Owns the read-eval loop, the REPL commands (`/reset`, `/model NAME`, `/exit`, `/help`) and
the Ctrl-C rules: at the prompt Ctrl-C (or Ctrl-D) ends the session with exit 0; during an
answer it closes the HTTP stream (the server sees the disconnect and aborts the request),
drops that turn from the history and returns to the prompt. It does not own HTTP details
(`client`) nor argument parsing (`app`).

Lines come from prompt_toolkit (history in ~/.cache/inferflux/history, in memory when that
is not writable) on a terminal, from `input()` when stdin is a pipe.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import httpx
import typer

from inferflux.cli.inferctl.client import ApiError, delta_text, iter_events, make_client

PROMPT = "> "
HELP = "commands: /reset (clear history), /model NAME, /exit (or Ctrl-D); Ctrl-C stops an answer"


class ReplOptions(NamedTuple):
    """Per-request settings from the command line."""

    model: str | None
    max_tokens: int
    temperature: float


class LineReader(Protocol):
    """Reads one line; raises EOFError (Ctrl-D, end of pipe) or KeyboardInterrupt (Ctrl-C)."""

    def read(self, prompt: str) -> str: ...


class PipeReader:
    """Lines from `input()`, for scripts that pipe into the REPL."""

    def read(self, prompt: str) -> str:
        return input(prompt)


class TerminalReader:
    """Lines from a prompt_toolkit session with a persistent (or in-memory) history."""

    def __init__(self, history_path: Path) -> None:
        from prompt_toolkit import PromptSession

        self._session: PromptSession[str] = PromptSession(history=_history(history_path))

    def read(self, prompt: str) -> str:
        return self._session.prompt(prompt)


def _history(path: Path) -> Any:  # Any: a prompt_toolkit History (imported lazily)
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        return InMemoryHistory()
    return FileHistory(str(path))


def make_reader() -> LineReader:
    """A terminal reader when stdin is a TTY, else a pipe reader."""
    if sys.stdin.isatty():
        return TerminalReader(Path.home() / ".cache" / "inferflux" / "history")
    return PipeReader()


@dataclass(slots=True)
class Dialogue:
    """The messages sent with every request: the seed (system, --message) plus the turns."""

    seed: list[dict[str, str]]
    turns: list[dict[str, str]] = field(default_factory=list)

    def messages(self, question: str) -> list[dict[str, str]]:
        return [*self.seed, *self.turns, {"role": "user", "content": question}]

    def add_turn(self, question: str, answer: str) -> None:
        self.turns += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]

    def reset(self) -> None:
        self.turns.clear()


class Answer(NamedTuple):
    """One streamed answer: its text, whether it completed, and its speed when known."""

    text: str
    completed: bool
    num_tokens: int | None = None
    tokens_per_s: float | None = None


class ChatRepl:
    """The loop: read a line, run a command or ask the server, print the streamed answer."""

    def __init__(
        self, client: httpx.Client, dialogue: Dialogue, options: ReplOptions, reader: LineReader
    ) -> None:
        self._client = client
        self._dialogue = dialogue
        self._model = options.model
        self._options = options
        self._reader = reader

    def run(self) -> int:
        """Until /exit, Ctrl-D or Ctrl-C at the prompt; returns the exit code (0)."""
        typer.echo(f"inferctl chat on {self._client.base_url} ({HELP})")
        while True:
            try:
                line = self._reader.read(PROMPT).strip()
            except (EOFError, KeyboardInterrupt):
                typer.echo("")
                return 0
            if not line:
                continue
            if line.startswith("/"):
                if not self._command(line):
                    return 0
                continue
            self._ask(line)

    def _command(self, line: str) -> bool:
        """Runs a REPL command; False means leave the REPL."""
        name, _, argument = line.partition(" ")
        if name in ("/exit", "/quit"):
            return False
        if name == "/reset":
            self._dialogue.reset()
            typer.echo("(history cleared)")
        elif name == "/model" and argument.strip():
            self._model = argument.strip()
            typer.echo(f"(model: {self._model})")
        elif name == "/model":
            typer.echo(f"(model: {self._model or 'the server default'})")
        else:
            typer.echo(f"unknown command {name}; {HELP}")
        return True

    def _ask(self, question: str) -> None:
        body: dict[str, Any] = {
            "messages": self._dialogue.messages(question),
            "max_tokens": self._options.max_tokens,
            "temperature": self._options.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self._model:
            body["model"] = self._model
        answer = self._stream(body)
        typer.echo("")
        if not answer.completed:
            typer.echo("(cancelled: this turn is not kept in the history)")
            return
        self._dialogue.add_turn(question, answer.text)
        if answer.tokens_per_s is not None:
            typer.echo(f"[{answer.num_tokens} tokens, {answer.tokens_per_s:.1f} tokens/s]")

    def _stream(self, body: dict[str, Any]) -> Answer:
        """Prints the answer as it streams. Ctrl-C closes the stream (the server aborts)."""
        pieces: list[str] = []
        first_token_at: float | None = None
        usage: dict[str, Any] = {}
        try:
            with self._client.stream("POST", "/v1/chat/completions", json=body) as response:
                for event in iter_events(response):
                    text = delta_text(event)
                    if text:
                        first_token_at = first_token_at or time.monotonic()
                        pieces.append(text)
                        typer.echo(text, nl=False)
                    usage = event.get("usage") or usage
        except KeyboardInterrupt:
            return Answer("".join(pieces), completed=False)
        except ApiError as exc:
            typer.echo(f"\ninferctl: {exc}", err=True)
            return Answer("".join(pieces), completed=False)
        except httpx.HTTPError as exc:
            typer.echo(f"\ninferctl: cannot reach {self._client.base_url}: {exc}", err=True)
            return Answer("".join(pieces), completed=False)
        return _finished("".join(pieces), usage, first_token_at)


def _finished(text: str, usage: dict[str, Any], first_token_at: float | None) -> Answer:
    num_tokens = usage.get("completion_tokens")
    if num_tokens is None or first_token_at is None:
        return Answer(text, completed=True)
    elapsed_s = max(time.monotonic() - first_token_at, 1e-6)
    return Answer(text, True, num_tokens, num_tokens / elapsed_s)


def run(base: str, seed: list[dict[str, str]], options: ReplOptions) -> int:
    """Runs the REPL against `base` with `seed` messages first; returns the exit code."""
    with make_client(base) as client:
        return ChatRepl(client, Dialogue(seed), options, make_reader()).run()
