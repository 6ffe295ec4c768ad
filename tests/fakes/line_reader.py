"""`FakeLineReader`: the `LineReader` protocol of `inferctl chat --interactive` from a script."""

from __future__ import annotations

from collections.abc import Iterable


class FakeLineReader:
    """Returns scripted lines; an exception class in the script (EOFError,
    KeyboardInterrupt) is raised instead; EOFError when the script runs out."""

    def __init__(self, script: Iterable[str | type[BaseException]]) -> None:
        self._script = list(script)
        self.prompts: list[str] = []

    def read(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if not self._script:
            raise EOFError
        item = self._script.pop(0)
        if isinstance(item, str):
            return item
        raise item
