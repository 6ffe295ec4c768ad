"""Fuzzing behind `make chaos`: schemathesis with 1,000 cases over every route, admin
included, on a throwaway server (tests/integration/test_schemathesis.py: 0 5xx, responses
as documented), and the hypothesis fuzzers of tests/unit/fuzz with 2,000 examples each."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from tests.chaos.context import ChaosRun
from tests.chaos.report import FaultResult

SCHEMATHESIS_CASES = 1000


def _pytest(run: ChaosRun, name: str, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    log_path = run.log_dir / f"{name}.log"
    with log_path.open("w") as log:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-s",
                "-p",
                "no:cacheprovider",
                "-o",
                "timeout=3600",
                *args,
            ],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=3600,
            check=False,
        )
    return done.returncode, log_path.read_text(errors="replace")


def schemathesis_all_routes(run: ChaosRun) -> FaultResult:
    cases = SCHEMATHESIS_CASES // 3 if run.quick else SCHEMATHESIS_CASES
    result = FaultResult(
        f"schemathesis, {cases} cases, every route incl. admin",
        target="0 5xx; every response as documented",
        passed=True,
    )
    env = {
        "INFERFLUX_SCHEMATHESIS_CASES": str(cases),
        "INFERFLUX_SCHEMATHESIS_ADMIN": "1",
    }
    code, log = _pytest(run, "schemathesis", ["tests/integration/test_schemathesis.py"], env)
    found = re.search(r"schemathesis: (\d+) requests", log)
    result.sent = int(found.group(1)) if found else 0
    result.failed = log.count(" (positive):") + log.count(" (negative):")
    result.notes.append(f"pytest exit {code}; log {run.log_dir / 'schemathesis.log'}")
    result.check(code == 0, "pytest passed")
    return result


def hypothesis_parsers(run: ChaosRun) -> FaultResult:
    profile, examples = ("default", "60") if run.quick else ("chaos", "2,000")
    result = FaultResult(
        "hypothesis: GGUF, frames, chat template, schema/grammar, JWT",
        target=f"every parser answers its own clean error ({examples} examples per property)",
        passed=True,
    )
    code, log = _pytest(run, "hypothesis", ["tests/unit/fuzz"], {"HYPOTHESIS_PROFILE": profile})
    found = re.search(r"(\d+) passed", log)
    failed = re.search(r"(\d+) failed", log)
    result.sent = int(found.group(1)) if found else 0
    result.failed = int(failed.group(1)) if failed else 0
    result.notes.append(f"{result.sent} properties passed, profile {profile}; pytest exit {code}")
    result.check(code == 0, "pytest passed")
    return result


def fuzz(run: ChaosRun) -> list[FaultResult]:
    results = []
    for check in (hypothesis_parsers, schemathesis_all_routes):
        started = time.monotonic()
        result = check(run)
        result.duration_s = time.monotonic() - started
        results.append(result)
    return results
