"""The runtime dependencies of InferFlux, as installed: what `pip install inferflux`
brings, dev tools left out. Shared by `make licenses`, `make sbom` and `make audit`.

    python scripts/runtime_deps.py      # print them, one `name==version` a line

The installed `inferflux` distribution's requirements, followed recursively through the
installed distributions: markers evaluated, extras followed (`PyJWT[crypto]` brings
`cryptography`), the optional `dev` extra never.
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT_DISTRIBUTION = "inferflux"


def runtime_distributions(root: str = ROOT_DISTRIBUTION) -> dict[str, str]:
    """Every installed distribution `root` needs at run time: canonical name → version."""
    found: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    pending: list[tuple[str, str]] = [(root, "")]
    while pending:
        name, extra = pending.pop()
        key = canonicalize_name(name)
        if (key, extra) in seen:
            continue
        seen.add((key, extra))
        dist = metadata.distribution(name)
        found[key] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is not None and not marker.evaluate({"extra": extra}):
                continue
            pending.append((requirement.name, ""))
            pending.extend((requirement.name, e) for e in requirement.extras)
    found.pop(canonicalize_name(root))
    return dict(sorted(found.items()))


if __name__ == "__main__":
    for name, version in runtime_distributions().items():
        sys.stdout.write(f"{name}=={version}\n")
