"""Build hook: the wheel carries the gRPC code generated from proto/ (everything else is
in pyproject.toml).

The generated package `inferflux.api.grpc.gen` is gitignored: `make proto` writes it into
the source tree for development. A wheel built where it is missing (a clean clone, or
the sdist, which never carries it) gets it from `build_py`, which runs grpc_tools.protoc
(a build requirement, pyproject.toml [build-system]) the way `make proto` does: protoc
mirrors the proto's path, and the stubs' absolute import of their messages becomes a
relative one.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO = Path("inferflux/v1/inference.proto")
GEN = Path("inferflux/api/grpc/gen")
GENERATED = ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py")


def generate_grpc(out: Path) -> None:
    """Write the gRPC package generated from proto/ into `out`."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{ROOT / 'proto'}",
                f"-I{well_known}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                str(ROOT / "proto" / PROTO),
            ]
        )
        if status != 0:
            raise RuntimeError(f"grpc_tools.protoc failed on proto/{PROTO} (status {status})")
        out.mkdir(parents=True, exist_ok=True)
        made = Path(tmp) / PROTO.parent
        for name in GENERATED:
            text = (made / name).read_text()
            if name.endswith("_grpc.py"):
                text = re.sub(r"^from inferflux\.v1 import", "from . import", text, flags=re.M)
            (out / name).write_text(text)
    (out / "__init__.py").write_text(f'"""Generated from proto/{PROTO} at build time."""\n')


class BuildPyWithGrpc(build_py):
    """`build_py`, then the generated gRPC package when the source tree has none."""

    def run(self) -> None:
        super().run()
        if not (ROOT / "src" / GEN / "inference_pb2.py").is_file():
            generate_grpc(Path(self.build_lib) / GEN)


setup(cmdclass={"build_py": BuildPyWithGrpc})
