"""`make licenses`: fail on any runtime dependency whose license is outside the allow-list.

    python scripts/check_licenses.py            # check; exit 1 naming each offender
    python scripts/check_licenses.py --list     # print every runtime dependency and license

The runtime dependencies are what `pip install inferflux` installs
(scripts/runtime_deps.py); dev tools are not in it. Each one's license comes from pip-licenses
(`--from=mixed`: the trove classifiers, else the License / License-Expression field) and
is mapped to an SPDX id by scripts/licenses.toml, which also holds the allow-list, the
explicitly named exceptions (with their reasons) and the served models' own licenses
(docs/supply-chain.md).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name
from runtime_deps import runtime_distributions

POLICY = Path(__file__).resolve().parent / "licenses.toml"


def declared_licenses(names: list[str]) -> dict[str, str]:
    """What each distribution declares, as pip-licenses reads it (canonical name → text)."""
    command = [
        sys.executable, "-m", "piplicenses", "--from=mixed", "--format=json", "--packages", *names
    ]  # fmt: skip
    rows = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    declared = {canonicalize_name(row["Name"]): row["License"] for row in rows}
    for name in names:
        if declared.get(name, "UNKNOWN") == "UNKNOWN":  # no License field: the classifiers
            declared[name] = "; ".join(_classifier_licenses(name)) or "UNKNOWN"
    return declared


def _classifier_licenses(name: str) -> list[str]:
    classifiers = metadata.metadata(name).get_all("Classifier") or []
    prefix = "License :: OSI Approved :: "
    return [c[len(prefix) :] for c in classifiers if c.startswith(prefix)]


def spdx_terms(declared: str, aliases: dict[str, str]) -> list[list[str]]:
    """A declared license as alternatives (OR) of conjunctions (AND) of SPDX ids.

    pip-licenses joins several classifiers with "; " (a choice of licenses, as PyPI
    reads them); an SPDX expression says OR / AND itself. Parentheses are dropped (no
    dependency nests them deeper than one level) unless the alias names them.
    """
    alternatives = []
    for classifier in re.split(r";\s*", declared):
        if classifier in aliases:
            alternatives.append([aliases[classifier]])
            continue
        for part in re.split(r"\s+OR\s+", classifier.replace("(", "").replace(")", "")):
            terms = [t.strip() for t in re.split(r"\s+AND\s+", part) if t.strip()]
            alternatives.append([aliases.get(term, term) for term in terms])
    return alternatives


def problems(
    versions: dict[str, str], declared: dict[str, str], policy: dict[str, object]
) -> list[str]:
    """One line per runtime dependency the policy refuses."""
    allowed = set(policy["allow"])  # type: ignore[arg-type]
    aliases: dict[str, str] = policy["aliases"]  # type: ignore[assignment]
    exceptions: dict[str, dict[str, str]] = policy["exceptions"]  # type: ignore[assignment]
    found = []
    for name, version in versions.items():
        text = declared.get(name, "UNKNOWN")
        exception = exceptions.get(name)
        if exception is not None:
            if exception["declared"] != text:
                found.append(
                    f"{name} {version}: declares {text!r} now, but its exception in "
                    f"{POLICY.name} was granted for {exception['declared']!r}: review it"
                )
            continue
        terms = spdx_terms(text, aliases)
        if not any(all(t in allowed for t in conjunction) for conjunction in terms):
            found.append(
                f"{name} {version}: {text!r} is not on the allow-list "
                f"({', '.join(sorted(allowed))}); replace the dependency, or name it under "
                f"[exceptions] in scripts/{POLICY.name} with the reason"
            )
    stale = sorted(set(exceptions) - set(versions))
    found += [
        f"{name}: an exception in {POLICY.name} for a package no longer used" for name in stale
    ]
    return found


def say(line: str, *, err: bool = False) -> None:
    (sys.stderr if err else sys.stdout).write(line + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print each dependency's license")
    args = parser.parse_args()
    policy = tomllib.loads(POLICY.read_text())
    versions = runtime_distributions()
    declared = declared_licenses(list(versions))
    if args.list:
        for name, version in versions.items():
            say(f"{name}=={version}\t{declared.get(name, 'UNKNOWN')}")
        return 0
    found = problems(versions, declared, policy)
    for line in found:
        say(f"licenses: {line}", err=True)
    if found:
        return 1
    say(
        f"licenses: {len(versions)} runtime dependencies, all allowed "
        f"({len(policy['exceptions'])} named exceptions, scripts/{POLICY.name})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
