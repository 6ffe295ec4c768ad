"""The supply-chain scripts' logic: scripts/check_licenses.py (the license policy),
scripts/audit.py (triage of pip-audit's report), scripts/runtime_deps.py (the runtime
set), scripts/sbom.py (cutting the SBOM down to it). The data here are made up; the
real policy file is checked against the real environment."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import audit  # noqa: E402
import check_licenses  # noqa: E402
import runtime_deps  # noqa: E402
import sbom  # noqa: E402

POLICY = tomllib.loads((SCRIPTS / "licenses.toml").read_text())


@pytest.mark.parametrize(
    ("declared", "allowed"),
    [
        ("MIT License", True),
        ("BSD License; Apache Software License", True),  # classifiers: a choice
        ("Apache-2.0 OR BSD-3-Clause", True),
        ("ISC License (ISCL)", True),
        ("Apache-2.0 AND BSD-2-Clause", True),
        ("MPL-2.0 AND MIT", False),  # AND: every part must be allowed
        ("GNU General Public License v3 (GPLv3)", False),
        ("UNKNOWN", False),
    ],
)
def test_the_allow_list(declared: str, allowed: bool) -> None:
    found = check_licenses.problems({"pkg": "1.0"}, {"pkg": declared}, {**POLICY, "exceptions": {}})
    assert (not found) is allowed, found


def test_an_exception_passes_only_for_the_license_it_was_granted_for() -> None:
    exceptions = {"certifi": {"declared": "MPL-2.0", "reason": "data"}}
    policy = {**POLICY, "exceptions": exceptions}
    assert check_licenses.problems({"certifi": "1"}, {"certifi": "MPL-2.0"}, policy) == []
    (changed,) = check_licenses.problems({"certifi": "1"}, {"certifi": "GPL-3.0"}, policy)
    assert "review it" in changed
    (stale,) = check_licenses.problems({}, {}, policy)
    assert "no longer used" in stale


def test_the_real_policy_passes_the_installed_runtime_dependencies() -> None:
    versions = runtime_deps.runtime_distributions()
    assert {"fastapi", "llama-cpp-python", "cryptography"} <= set(versions)  # PyJWT[crypto]
    assert not {"pytest", "ruff", "pip-audit"} & set(versions)  # dev tools are not runtime
    declared = check_licenses.declared_licenses(list(versions))
    assert check_licenses.problems(versions, declared, POLICY) == []


def test_audit_triage_splits_findings_and_unchecked_packages() -> None:
    report = {
        "dependencies": [
            {"name": "a", "version": "1", "vulns": [
                {"id": "PYSEC-1", "aliases": ["CVE-1"], "fix_versions": ["2"]},
                {"id": "GHSA-x", "aliases": [], "fix_versions": []},
            ]},
            {"name": "b", "version": "1", "vulns": []},
            {"name": "c", "skip_reason": "Dependency not found on PyPI"},
        ],
    }  # fmt: skip
    triaged = {"CVE-1": {"decision": "not affected", "reason": "never called"}}
    untriaged, accepted, skipped = audit.classify(report, triaged)
    assert untriaged == ["a 1: GHSA-x (fix: none)"]
    assert accepted == ["a 1: PYSEC-1 (fix: 2) - triaged: not affected"]
    assert skipped == ["c"]


def test_the_sbom_keeps_the_runtime_components_and_their_edges() -> None:
    bom = {
        "metadata": {"component": {"bom-ref": "root"}},
        "components": [
            {"name": "FastAPI", "bom-ref": "fastapi"},
            {"name": "pytest", "bom-ref": "pytest"},
        ],
        "dependencies": [
            {"ref": "root", "dependsOn": ["fastapi", "pytest"]},
            {"ref": "fastapi", "dependsOn": []},
            {"ref": "pytest", "dependsOn": []},
        ],
    }
    cut = sbom.runtime_only(bom, {"fastapi"})
    assert [c["name"] for c in cut["components"]] == ["FastAPI"]
    assert cut["dependencies"] == [
        {"ref": "root", "dependsOn": ["fastapi"]},
        {"ref": "fastapi", "dependsOn": []},
    ]
