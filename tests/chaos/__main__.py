"""`python -m tests.chaos` (`make chaos`): run the fault catalogue and write RELIABILITY.md.

.venv/bin/python -m tests.chaos                       # every fault, then the soak
.venv/bin/python -m tests.chaos --only worker,client  # some groups
.venv/bin/python -m tests.chaos --soak-requests 2000  # a shorter soak
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.chaos.catalogue import GROUPS
from tests.chaos.context import ChaosRun
from tests.chaos.report import FaultResult, earlier, write


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--only", default="", help=f"comma-separated groups of {list(GROUPS)}")
    parser.add_argument("--out", type=Path, default=Path("RELIABILITY.md"))
    parser.add_argument("--log-dir", type=Path, default=None, help="servers' logs (a tmp dir)")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--soak-requests", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="shorter load phases")
    parser.add_argument(
        "--update", action="store_true", help="keep the other groups' rows of the last run"
    )
    return parser.parse_args(argv)


def _say(line: str) -> None:
    sys.stderr.write(f"chaos: {line}\n")
    sys.stderr.flush()


def _run_group(
    name: str, group: Callable[[ChaosRun], list[FaultResult]], run: ChaosRun
) -> list[FaultResult]:
    _say(f"{name} ...")
    started = time.monotonic()
    try:
        results = group(run)
    except Exception as exc:  # noqa: BLE001 - a crashed group is a failed row, not a stop
        results = [FaultResult(name, target="the group runs", notes=[f"crashed: {exc!r}"])]
        results[0].duration_s = time.monotonic() - started
    for r in results:
        verdict = "pass" if r.passed else "FAIL"
        recovery = "-" if r.recovery_s is None else f"{r.recovery_s:.1f} s"
        _say(f"  {verdict} {r.name}: sent {r.sent} failed {r.failed} lost {r.lost} "
             f"recovery {recovery}")  # fmt: skip
    return results


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    chosen = [g for g in args.only.split(",") if g] or list(GROUPS)
    unknown = set(chosen) - set(GROUPS)
    if unknown:
        _say(f"unknown groups {sorted(unknown)}; known: {list(GROUPS)}")
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="inferflux-chaos-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    run = ChaosRun(log_dir, args.quick, args.streams, args.soak_requests)
    _say(f"logs in {log_dir}")
    started = time.monotonic()
    kept = earlier(args.out, set(chosen)) if args.update else []
    results: list[FaultResult] = []
    for name in chosen:
        for result in _run_group(name, GROUPS[name], run):
            result.group = name
            results.append(result)
        command = "python -m tests.chaos " + shlex.join(sys.argv[1:] if argv is None else argv)
        if kept:
            command += (
                "` (the other groups' rows kept from the run before; see their dates in git) `"
            )
        order = {group: i for i, group in enumerate(GROUPS)}
        rows = sorted([*kept, *results], key=lambda r: order.get(r.group, len(order)))
        write(args.out, rows, command.strip(), time.monotonic() - started)
    _say(f"wrote {args.out}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
