"""`make sbom`: a CycloneDX SBOM (JSON) of InferFlux's runtime environment.

    python scripts/sbom.py dist/inferflux.cdx.json

cyclonedx-py reads the installed environment (`cyclonedx-py environment`); its
components are then cut down to the runtime dependencies (scripts/runtime_deps.py: what
`pip install inferflux` installs, no dev tools), the dependency graph with them. The
root component is InferFlux itself, from pyproject.toml. Offline: nothing is fetched.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name
from runtime_deps import runtime_distributions

ROOT = Path(__file__).resolve().parent.parent


def environment_bom(python: str) -> dict[str, object]:
    """cyclonedx-py's SBOM of every distribution installed for `python`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "env.cdx.json"
        subprocess.run(
            [
                sys.executable, "-m", "cyclonedx_py", "environment", "--of", "JSON",
                "--pyproject", str(ROOT / "pyproject.toml"), "--output-reproducible",
                "-o", str(out), python,
            ],
            check=True,
        )  # fmt: skip
        bom: dict[str, object] = json.loads(out.read_text())
    return bom


def source_version() -> str:
    """`inferflux.__version__` of this tree (pyproject's version is dynamic: cyclonedx-py
    cannot read it)."""
    init = (ROOT / "src" / "inferflux" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"', init, flags=re.M)
    if match is None:
        raise SystemExit("sbom: no __version__ in src/inferflux/__init__.py")
    return match.group(1)


def runtime_only(bom: dict[str, object], keep: set[str]) -> dict[str, object]:
    """`bom` with only the components named in `keep` (canonical names) and their edges."""
    components = [
        c
        for c in bom.get("components", [])  # type: ignore[attr-defined]
        if canonicalize_name(c["name"]) in keep
    ]
    refs = {c["bom-ref"] for c in components}
    root = bom["metadata"]["component"]["bom-ref"]  # type: ignore[index]
    dependencies = []
    for node in bom.get("dependencies", []):  # type: ignore[attr-defined]
        if node["ref"] in refs or node["ref"] == root:
            kept = [d for d in node.get("dependsOn", []) if d in refs]
            dependencies.append({**node, "dependsOn": kept})
    return {**bom, "components": components, "dependencies": dependencies}


def say(line: str, *, err: bool = False) -> None:
    (sys.stderr if err else sys.stdout).write(line + "\n")


def main() -> int:
    if len(sys.argv) != 2:
        say(__doc__ or "", err=True)
        return 2
    target = Path(sys.argv[1])
    runtime = set(runtime_distributions())
    bom = runtime_only(environment_bom(sys.executable), runtime)
    bom["metadata"]["component"]["version"] = source_version()  # type: ignore[index]
    missing = runtime - {canonicalize_name(c["name"]) for c in bom["components"]}  # type: ignore[attr-defined]
    if missing:
        say(f"sbom: runtime dependencies missing from the SBOM: {sorted(missing)}", err=True)
        return 1
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(bom, indent=2) + "\n")
    say(f"sbom: {target} (CycloneDX {bom['specVersion']}, {len(runtime)} runtime components)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
