"""The three servers (and their settings) the comparison starts, one at a time.

Every server gets the same model, 2 threads, a context of `CTX_PER_SEQ` tokens per
sequence and `parallel` sequences (the benchmark level's concurrency):

    inferflux         `inferflux serve`, defaults except scheduler.max_num_seqs = parallel
                      and model.ctx_size = CTX_PER_SEQ (its default for both models).
    llama-server      `-np parallel -c parallel*CTX_PER_SEQ -t 2 -tb 2` (continuous batching
                      and flash attention are its defaults; -np set means a per-slot KV).
    llama-cpp-python  `python -m llama_cpp.server`: one sequence whatever `parallel`
                      (it serialises requests); `--n_ctx CTX_PER_SEQ`, 2 threads,
                      `--interrupt_requests False` (by default a new request cuts off the one
                      streaming), `--logits_all False` and `--flash_attn True` (its fastest
                      settings for this workload).

Models without a chat template in the GGUF (Gemma 3 270M base): InferFlux falls back to
its Gemma template; llama-server gets the same Jinja text (`--chat-template-file`) and
llama-cpp-python its built-in "gemma" format, which renders the same turns but drops
system messages (the agent workload folds the system prompt into the first user turn
for such models, as InferFlux's template does, so every server sees the same text).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compare.rss import TreeSampler
from compare.toolchain import CACHE
from launch import INFERFLUX, start_process

CTX_PER_SEQ = 4096
THREADS = 2
SERVERS = ("inferflux", "llama-server", "llama-cpp-python")


@dataclass(frozen=True, slots=True)
class Model:
    """A model under test. When its GGUF has no chat template: `builtin_template`, the
    name of InferFlux's fallback among llama.cpp's built-in formats, and `template_text`,
    the fallback's Jinja text. `eog_ids`: end-of-generation tokens (banned where
    ignore_eos is missing)."""

    key: str
    path: str
    builtin_template: str | None
    template_text: str | None
    eog_ids: tuple[int, ...]
    kv_bytes_per_token: int

    @property
    def file_bytes(self) -> int:
        return Path(self.path).stat().st_size


@dataclass(frozen=True, slots=True)
class Server:
    """How to start one server and what its requests must carry."""

    name: str
    argv: list[str]
    ready_path: str
    env: dict[str, str] = field(default_factory=dict)
    ignore_eos: bool = True  # accepts `ignore_eos`; else EOG tokens are banned by logit_bias


@dataclass(frozen=True, slots=True)
class Toolchain:
    """What `compare.toolchain` built: llama-server's binary, the llama-cpp-python venv."""

    llama_server: str | None
    llama_cpp_python: str | None


def make_server(
    name: str, tools: Toolchain, model: Model, port: int, parallel: int, threads: int = THREADS
) -> Server:
    """The Server `name` for `model` on 127.0.0.1:`port` with `parallel` sequences."""
    address = ["--host", "127.0.0.1", "--port", str(port)]
    if name == "inferflux":
        env = {
            "INFERFLUX_SCHEDULER__MAX_NUM_SEQS": str(parallel),
            "INFERFLUX_MODEL__CTX_SIZE": str(CTX_PER_SEQ),
            "INFERFLUX_SCHEDULER__QUEUE_TIMEOUT_S": "0",  # the others never shed load
            "INFERFLUX_RUNTIME__N_THREADS": str(threads),
        }
        return Server(name, [INFERFLUX, "serve", *address, "--model", model.path], "/readyz", env)
    if name == "llama-server" and tools.llama_server:
        template = (
            ["--chat-template-file", str(_template_file(model))] if model.template_text else []
        )
        argv = [tools.llama_server, "-m", model.path, *address, "-np", str(parallel)]
        argv += ["-c", str(parallel * CTX_PER_SEQ), "-t", str(threads), "-tb", str(threads)]
        return Server(name, [*argv, *template, "--no-webui"], "/health")
    if name == "llama-cpp-python" and tools.llama_cpp_python:
        argv = [tools.llama_cpp_python, "-m", "llama_cpp.server", "--model", model.path]
        argv += [*address, "--n_ctx", str(CTX_PER_SEQ), "--n_threads", str(threads)]
        argv += ["--n_threads_batch", str(threads), "--interrupt_requests", "False"]
        argv += ["--logits_all", "False", "--flash_attn", "True", "--verbose", "False"]
        if model.builtin_template:
            argv += ["--chat_format", model.builtin_template]
        return Server(name, argv, "/v1/models", ignore_eos=False)
    raise ValueError(f"unknown or unbuilt server {name!r}")


def _template_file(model: Model) -> Path:
    """InferFlux's fallback template as a file, for llama-server (renders the same text)."""
    path = CACHE / "templates" / f"{model.key}.jinja"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.template_text or "", encoding="utf-8")
    return path


def request_extras(server: Server, model: Model) -> dict[str, Any]:  # Any: JSON
    """Body fields that make `server` generate max_tokens whatever the model says."""
    if server.ignore_eos:
        return {}
    return {"logit_bias": {str(t): -100 for t in model.eog_ids}}


@dataclass(slots=True)
class Running:
    """A started server: its URL and the RSS sampler of its process tree."""

    server: Server
    url: str
    process: subprocess.Popen[bytes]
    rss: TreeSampler


@contextmanager
def running(server: Server, port: int, log_path: Path) -> Iterator[Running]:
    """Start `server`, wait until ready, sample its memory; stop it on exit."""
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    process = start_process(server.argv, url + server.ready_path, server.env, log_path, 300)
    handle = Running(server, url, process, TreeSampler(process.pid))
    try:
        yield handle
    finally:
        handle.rss.stop()
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
