"""Fail when a module or function outgrows the project's limits (800 lines, 80-line functions)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80


def main() -> int:
    problems: list[str] = []
    for path in sorted(Path("src").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        n_lines = text.count("\n") + 1
        if n_lines > MAX_MODULE_LINES:
            problems.append(f"{path}: {n_lines} lines > {MAX_MODULE_LINES}; split it")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    problems.append(
                        f"{path}:{node.lineno} {node.name}: {length} lines > {MAX_FUNCTION_LINES}"
                    )
    for problem in problems:
        sys.stderr.write(problem + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
