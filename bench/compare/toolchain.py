"""The competitors, built once and cached under .cache/compare/ (git-ignored).

`llama_server()` compiles `llama-server` from the llama.cpp tree vendored in the
llama-cpp-python sdist that pyproject.toml pins, so both sides run the same llama.cpp
commit; `llama_cpp_python_server()` makes a venv with `llama-cpp-python[server]` at the
same version (pip's wheel cache supplies the compiled bindings). Each step is skipped
when its stamp file records the same version.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("INFERFLUX_COMPARE_CACHE", REPO / ".cache" / "compare"))
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)


@dataclass(frozen=True, slots=True)
class LlamaServerBuild:
    """A built llama-server and what it was built from."""

    binary: str
    llama_cpp_python: str  # the sdist version the sources came from
    sdist_sha256: str
    llama_cpp_commit: str  # the sdist carries the submodule's git metadata
    ggml_version: str
    cmake_flags: list[str]


def pinned_version() -> str:
    """The llama-cpp-python version pyproject.toml pins (`llama-cpp-python==X`)."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'"llama-cpp-python==([^"]+)"', text)
    if match is None:
        raise SystemExit("pyproject.toml pins no llama-cpp-python version")
    return match.group(1)


def _run(cmd: list[str], log: Path) -> None:
    print("$ " + " ".join(cmd), flush=True)
    with log.open("a", encoding="utf-8") as out:
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"failed ({code}): {' '.join(cmd)}\n{tail}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_sources(version: str, root: Path, log: Path) -> tuple[Path, str]:
    """Download and unpack the sdist; (vendored llama.cpp dir, sdist sha256)."""
    sdist_dir = root / "sdist"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    name = f"llama_cpp_python-{version}.tar.gz"
    if not (sdist_dir / name).exists():
        _run(
            [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
            + ["-d", str(sdist_dir), f"llama-cpp-python=={version}"],
            log,
        )
    src = root / "src"
    if not (src / f"llama_cpp_python-{version}").exists():
        shutil.rmtree(src, ignore_errors=True)
        with tarfile.open(sdist_dir / name) as tar:
            tar.extractall(src, filter="data")
    return src / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp", _sha256(sdist_dir / name)


def _commit(llama_dir: Path) -> str:
    """The vendored llama.cpp's commit and date, or "unknown"."""
    try:
        out = subprocess.run(
            ["git", "-C", str(llama_dir), "log", "-1", "--format=%H %cs"],
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _ggml_version(llama_dir: Path) -> str:
    text = (llama_dir / "ggml" / "CMakeLists.txt").read_text(encoding="utf-8")
    parts = [re.search(rf"GGML_VERSION_{k} (\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "?" for m in parts)


def llama_server(jobs: int = 2) -> LlamaServerBuild:
    """Build (or reuse) llama-server for the pinned version; takes minutes on 2 cores."""
    version = pinned_version()
    root = CACHE / f"llama.cpp-{version}"
    stamp = root / "build-info.json"
    if stamp.exists():
        recorded = json.loads(stamp.read_text(encoding="utf-8"))
        if recorded.get("llama_cpp_python") == version and Path(recorded["binary"]).exists():
            return LlamaServerBuild(**recorded)
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    llama_dir, sha = _fetch_sources(version, root, log)
    build = root / "build"
    _run(["cmake", "-S", str(llama_dir), "-B", str(build), *CMAKE_FLAGS], log)
    _run(["cmake", "--build", str(build), "--target", "llama-server", f"-j{jobs}"], log)
    info = LlamaServerBuild(
        binary=str(build / "bin" / "llama-server"),
        llama_cpp_python=version,
        sdist_sha256=sha,
        llama_cpp_commit=_commit(llama_dir),
        ggml_version=_ggml_version(llama_dir),
        cmake_flags=list(CMAKE_FLAGS),
    )
    stamp.write_text(json.dumps(asdict(info), indent=2) + "\n", encoding="utf-8")
    return info


def llama_cpp_python_server() -> str:
    """The python of a venv with llama-cpp-python[server] at the pinned version."""
    version = pinned_version()
    venv = CACHE / "llama-cpp-python-venv"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.exists() and stamp.read_text(encoding="utf-8").strip() == version:
        return str(python)
    log = CACHE / "llama-cpp-python-venv.log"
    CACHE.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], log)
    _run(
        [str(python), "-m", "pip", "install", "--quiet", f"llama-cpp-python[server]=={version}"],
        log,
    )
    stamp.write_text(version + "\n", encoding="utf-8")
    return str(python)


if __name__ == "__main__":
    print(json.dumps(asdict(llama_server()), indent=2))
    print(llama_cpp_python_server())
