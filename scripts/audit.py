"""`make audit`: pip-audit over InferFlux's runtime dependencies, with triage.

    python scripts/audit.py             # exit 1 on an untriaged finding
    AUDIT_STRICT=1 python scripts/audit.py   # also exit 1 when the audit is incomplete

The runtime dependencies (scripts/runtime_deps.py), pinned to the installed versions,
are checked against PyPI's vulnerability data by pip-audit (nothing is installed).
Every finding is either triaged in scripts/audit.toml (its id, the package, the
decision and why; docs/supply-chain.md explains each) or fails the run. pip-audit needs
the network: when the vulnerability service cannot be reached, or cannot say anything
about some packages, the run prints `AUDIT INCOMPLETE` with the reason and the
packages not checked, and exits 0 (an outage of a third party does not block a build;
the line says it was not audited), or 1 with AUDIT_STRICT=1 (release builds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from runtime_deps import runtime_distributions

TRIAGE = Path(__file__).resolve().parent / "audit.toml"
TIMEOUT_S = 30


def run_pip_audit(pins: dict[str, str]) -> tuple[dict[str, object] | None, str]:
    """pip-audit's JSON report on `pins`, or None and the reason it gave none."""
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "runtime.txt"
        requirements.write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))
        report = Path(tmp) / "report.json"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip_audit",
                "-r",
                str(requirements),
                "--no-deps",
                "--disable-pip",
                "--progress-spinner",
                "off",
                "--timeout",
                str(TIMEOUT_S),
                "-f",
                "json",
                "-o",
                str(report),
            ],
            capture_output=True,
            text=True,
            check=False,  # exit 1 means findings too: the report says which
        )
        if report.is_file() and report.stat().st_size:
            return json.loads(report.read_text()), ""
    lines = (done.stderr or done.stdout).strip().splitlines()
    return None, lines[-1] if lines else f"pip-audit exited {done.returncode}"


def classify(
    report: dict[str, object], triaged: dict[str, dict[str, str]]
) -> tuple[list[str], list[str], list[str]]:
    """pip-audit's JSON report as (untriaged findings, triaged findings, packages not
    checked). A finding is triaged when its id or one of its aliases is in `triaged`."""
    untriaged, accepted, skipped = [], [], []
    for dependency in report["dependencies"]:  # type: ignore[attr-defined]
        if "skip_reason" in dependency:
            skipped.append(dependency["name"])
        for vuln in dependency.get("vulns", []):
            ids = {vuln["id"], *vuln.get("aliases", [])}
            line = (
                f"{dependency['name']} {dependency['version']}: {vuln['id']} (fix: "
                f"{', '.join(vuln['fix_versions']) or 'none'})"
            )
            decision = next((triaged[i] for i in sorted(ids) if i in triaged), None)
            if decision is None:
                untriaged.append(line)
            else:
                accepted.append(f"{line} - triaged: {decision['decision']}")
    return untriaged, accepted, skipped


def say(line: str, *, err: bool = False) -> None:
    (sys.stderr if err else sys.stdout).write(line + "\n")


def main() -> int:
    strict = os.environ.get("AUDIT_STRICT") == "1"
    triaged: dict[str, dict[str, str]] = tomllib.loads(TRIAGE.read_text()).get("triaged", {})
    pins = runtime_distributions()
    report, error = run_pip_audit(pins)
    if report is None:
        say(
            f"audit: AUDIT INCOMPLETE: pip-audit gave no report ({error}); "
            f"0 of {len(pins)} runtime dependencies checked",
            err=True,
        )
        return 1 if strict else 0
    untriaged, accepted, skipped = classify(report, triaged)
    for line in accepted:
        say(f"audit: known, triaged in scripts/{TRIAGE.name}: {line}")
    for line in untriaged:
        say(
            f"audit: UNTRIAGED: {line}: upgrade it, or triage it in scripts/{TRIAGE.name} "
            "and docs/supply-chain.md",
            err=True,
        )
    checked = len(pins) - len(skipped)
    if skipped:
        say(
            f"audit: AUDIT INCOMPLETE: {len(skipped)} of {len(pins)} runtime dependencies "
            "could not be checked (the vulnerability service did not know them or could "
            f"not be reached): {', '.join(skipped)}",
            err=True,
        )
    say(
        f"audit: {checked} of {len(pins)} runtime dependencies checked, "
        f"{len(untriaged)} untriaged and {len(accepted)} triaged findings"
    )
    if untriaged or (strict and skipped):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
