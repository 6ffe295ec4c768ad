"""Ollama model management and manifest persistence on a real server (SmolLM2), driven by
the real `ollama` Python client: a blob upload, `create` (from a blob and from a model,
with a system prompt and default options that really apply), `copy`, `show`, `list`,
`delete`; an admin-API load and `set_default`; then a restart of the server on the same
manifest that still serves every one of them. Admin scope required (401/403), and bad
input gets Ollama's `{"error"}` with the right status."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import ollama
import pytest
import yaml

from tests.integration.model_registry_setup import entry, link_into, sha256_file, write_config
from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

ADMIN_KEY = "sk-test-manage-admin-0123456789"
USER_KEY = "sk-test-manage-user-0123456789"
WAIT_S = 180.0
SYSTEM = "You are a pirate. Answer every question like a pirate would."
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass
class Served:
    folder: Path
    manifest: Path
    config: Path
    server: ServerProcess
    model_path: str

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, key: str | None = ADMIN_KEY) -> ollama.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return ollama.Client(host=self.url, headers=headers, timeout=300)

    def http(self, key: str | None = ADMIN_KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=300)

    def admin_changes(self) -> list[tuple[str, str]]:
        lines = (self.folder / "audit.jsonl").read_text(encoding="utf-8").splitlines()
        events = [json.loads(line) for line in lines]
        return [(e["action"], e["target"]) for e in events if e["event"] == "admin_change"]

    def manifest_entries(self) -> dict[str, dict]:
        data = yaml.safe_load(self.manifest.read_text(encoding="utf-8"))
        return {item["id"]: item for item in data["models"]}

    def restart(self) -> None:
        self.server.close()
        self.server = start(self.folder, self.config)


def start(folder: Path, config: Path) -> ServerProcess:
    log = folder / f"server-{len(list(folder.glob('server-*.log')))}.log"
    server = ServerProcess("--config", str(config), log_path=log)
    try:
        server.wait_ready(WAIT_S)
    except (RuntimeError, TimeoutError) as exc:
        server.close()
        pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-4000:]}")
    return server


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2_model_path) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("manage")
    smol = link_into(folder / "models", smollm2_model_path, "smollm2.gguf")
    manifest = folder / "manifest.yaml"
    first = entry("smollm2", smol, smollm2_model_path, default=True, n_ctx=512, workers=1)
    first["path"] = "models/smollm2.gguf"
    # the mapping form, with a comment-free layout the rewrite must keep
    manifest.write_text(yaml.safe_dump({"models": [first]}), encoding="utf-8")
    keys = [
        {"key": ADMIN_KEY, "id": "admin", "roles": ["admin"]},
        {"key": USER_KEY, "id": "user", "roles": ["user"]},
    ]
    config = write_config(
        folder / "config.yaml",
        manifest,
        registry={
            "path": str(manifest),
            "models_dir": str(folder),
            "poll_interval_ms": 200,
            "max_resident_models": 2,
        },
        auth={"api_keys": keys},
        audit={"enabled": True, "path": str(folder / "audit.jsonl")},
        scheduler={"max_num_seqs": 2, "prefix_cache": {"slots": 1}},
        runtime={"workers": 1, "n_threads": 1},
    )
    served = Served(folder, manifest, config, start(folder, config), smollm2_model_path)
    try:
        yield served
    finally:
        served.server.close()


def chat(client: ollama.Client, model: str, messages: list[dict]) -> ollama.ChatResponse:
    return client.chat(model=model, messages=messages, options={"temperature": 0, "seed": 1})


def test_management_needs_the_admin_scope(served: Served) -> None:
    digest = "sha256:" + "0" * 64
    calls = [
        ("DELETE", "/api/delete", {"model": "smollm2"}),
        ("POST", "/api/copy", {"source": "smollm2", "destination": "x"}),
        ("POST", "/api/create", {"model": "x", "from": "smollm2"}),
        ("POST", f"/api/blobs/{digest}", None),
        ("HEAD", f"/api/blobs/{digest}", None),
    ]
    for key, status in ((None, 401), (USER_KEY, 403)):
        with served.http(key) as http:
            for method, path, body in calls:
                response = http.request(method, path, json=body)
                assert response.status_code == status, (method, path, response.text)
                if method != "HEAD":
                    assert set(response.json()) == {"error"}, response.text
    with served.client(USER_KEY) as client, pytest.raises(ollama.ResponseError) as refused:
        client.delete("smollm2")
    assert refused.value.status_code == 403
    assert "smollm2" in served.manifest_entries()


def test_create_copy_show_delete_and_restart(served: Served) -> None:
    with served.client() as client:
        _create_copy_show_delete(served, client)
    _admin_load_and_set_default(served)
    served.restart()
    with served.client() as client:
        _assert_served_after_restart(served, client)


def _create_copy_show_delete(served: Served, client: ollama.Client) -> None:
    digest = client.create_blob(served.model_path)
    assert digest == f"sha256:{sha256_file(served.model_path)}"
    with served.http() as http:
        assert http.head(f"/api/blobs/{digest}").status_code == 200

    parameters = {"temperature": 0, "num_predict": 6, "stop": ["\n\n"]}
    created = client.create(
        model="pirate", files={"smollm2.gguf": digest}, system=SYSTEM, parameters=parameters
    )
    assert created.status == "success"
    progress = list(client.create(model="terse", from_="smollm2", system="Be terse.", stream=True))
    assert [p.status for p in progress][-1] == "success"
    assert client.copy("pirate", "parrot:latest").status == "success"

    names = {m.model for m in client.list().models}
    assert {"smollm2:latest", "pirate:latest", "terse:latest", "parrot:latest"} <= names
    shown = client.show("parrot")
    assert shown.modelinfo is not None and shown.details is not None
    with served.http() as http:
        assert http.post("/api/show", json={"model": "parrot"}).json()["system"] == SYSTEM
    assert shown.parameters is not None
    assert "temperature                    0" in shown.parameters
    assert 'stop                           "\\n\\n"' in shown.parameters
    assert f'SYSTEM """{SYSTEM}"""' in (shown.modelfile or "")

    _assert_system_and_defaults_apply(client)

    entries = served.manifest_entries()
    assert entries["pirate"]["system"] == SYSTEM
    assert entries["pirate"]["path"] == f"blobs/sha256-{digest.removeprefix('sha256:')}.gguf"
    assert entries["pirate"]["parameters"] == {
        "temperature": 0.0,
        "num_predict": 6,
        "stop": ["\n\n"],
    }
    assert entries["parrot"]["system"] == SYSTEM and entries["terse"]["system"] == "Be terse."
    assert entries["terse"]["path"] == "models/smollm2.gguf"
    assert entries["smollm2"]["default"] is True
    changes = served.admin_changes()
    assert ("model.blob_upload", digest) in changes
    assert {("model.create", "pirate"), ("model.create", "terse")} <= set(changes)
    assert ("model.copy", "parrot") in changes

    assert client.delete("terse").status == "success"
    assert "terse" not in served.manifest_entries()
    assert ("model.delete", "terse") in served.admin_changes()
    with pytest.raises(ollama.ResponseError) as missing:
        client.delete("terse")
    assert missing.value.status_code == 404 and missing.value.error == "model 'terse' not found"
    with pytest.raises(ollama.ResponseError) as default:
        client.delete("smollm2")
    assert default.value.status_code == 409


def _assert_system_and_defaults_apply(client: ollama.Client) -> None:
    """The created model's system prompt reaches the template (same prompt tokens and, at
    temperature 0, the same answer as the base model given that system message), and
    its num_predict applies when the request sets none."""
    with_system = [{"role": "system", "content": SYSTEM}, *QUESTION]
    base_plain = chat(client, "smollm2", QUESTION)
    base_system = client.chat(
        model="smollm2",
        messages=with_system,
        options={"temperature": 0, "seed": 1, "num_predict": 6},
    )
    pirate = chat(client, "pirate", QUESTION)
    assert pirate.prompt_eval_count == base_system.prompt_eval_count
    # (SmolLM2's template adds its own system prompt when there is none: a different one)
    assert pirate.prompt_eval_count != base_plain.prompt_eval_count
    assert pirate.message.content == base_system.message.content
    assert pirate.eval_count is not None and pirate.eval_count <= 6  # the model's num_predict
    # the request's own system message wins over the model's
    own = chat(client, "pirate", [{"role": "system", "content": "Be brief."}, *QUESTION])
    plain_own = client.chat(
        model="smollm2",
        messages=[{"role": "system", "content": "Be brief."}, *QUESTION],
        options={"temperature": 0, "seed": 1},
    )
    assert own.prompt_eval_count == plain_own.prompt_eval_count
    generated = client.generate(model="pirate", prompt="Where is Paris?")
    reference = client.generate(
        model="smollm2", prompt="Where is Paris?", system=SYSTEM, options={"temperature": 0}
    )
    assert generated.prompt_eval_count == reference.prompt_eval_count


def _admin_load_and_set_default(served: Served) -> None:
    body = {
        "action": "load",
        "id": "smol-admin",
        "path": "models/smollm2.gguf",
        "sha256": sha256_file(served.model_path),
        "aliases": ["sa"],
        "n_ctx": 256,
    }
    with served.http() as http:
        loaded = http.post("/v1/admin/models", json=body)
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["persisted"] is True
        made = http.post("/v1/admin/models", json={"action": "set_default", "id": "smol-admin"})
        assert made.status_code == 200 and made.json()["persisted"] is True
        unloaded = http.post("/v1/admin/models", json={"action": "unload", "id": "pirate"})
        assert unloaded.status_code == 200, unloaded.text  # stops serving, stays listed
    entries = served.manifest_entries()
    assert entries["smol-admin"]["aliases"] == ["sa"] and entries["smol-admin"]["n_ctx"] == 256
    assert entries["smol-admin"]["default"] is True and "default" not in entries["smollm2"]
    assert "pirate" in entries


def _assert_served_after_restart(served: Served, client: ollama.Client) -> None:
    names = {m.model for m in client.list().models}
    assert names == {"smol-admin:latest", "smollm2:latest", "pirate:latest", "parrot:latest"}
    with served.http() as http:
        models = {m["id"]: m for m in http.get("/v1/admin/models").json()["data"]}
        assert models["smol-admin"]["default"] is True
        answer = http.post(
            "/v1/chat/completions",
            json={"model": "sa", "messages": QUESTION, "max_tokens": 4},
        )
        assert answer.status_code == 200 and answer.json()["model"] == "smol-admin"
    with_system = [{"role": "system", "content": SYSTEM}, *QUESTION]
    base_system = chat(client, "smollm2", with_system)
    assert chat(client, "parrot", QUESTION).prompt_eval_count == base_system.prompt_eval_count


def test_bad_input_is_a_clear_ollama_error(served: Served) -> None:
    cases = [
        ("POST", "/api/create", {"model": "x:v2", "from": "smollm2"}, 400, "no tags"),
        ("POST", "/api/create", {"model": "x"}, 400, "needs `from`"),
        ("POST", "/api/create", {"model": "x", "from": "nope"}, 404, "model 'nope' not found"),
        (
            "POST",
            "/api/create",
            {"model": "x", "from": "smollm2", "quantize": "q4_K_M"},
            400,
            "quantize",
        ),
        (
            "POST",
            "/api/create",
            {"model": "x", "from": "smollm2", "template": "{{ .Prompt }}"},
            400,
            "Jinja",
        ),
        (
            "POST",
            "/api/create",
            {"model": "x", "from": "smollm2", "parameters": {"mirostat": 2}},
            400,
            "'mirostat' is not supported",
        ),
        (
            "POST",
            "/api/create",
            {"model": "x", "from": "smollm2", "parameters": {"temperature": "hot"}},
            400,
            "parameters.temperature",
        ),
        (
            "POST",
            "/api/create",
            {"model": "x", "files": {"a.gguf": "sha256:" + "1" * 64}},
            400,
            "was not uploaded",
        ),
        ("POST", "/api/create", {"model": "x", "from": "../outside.gguf"}, 422, "outside"),
        (
            "POST",
            "/api/copy",
            {"source": "nope", "destination": "x"},
            404,
            "model 'nope' not found",
        ),
        ("DELETE", "/api/delete", {}, 400, "model is required"),
        ("POST", "/api/create", b"{not json", 400, "not valid JSON"),
    ]
    with served.http() as http:
        for method, path, body, status, words in cases:
            if isinstance(body, bytes):
                response = http.request(method, path, content=body)
            else:
                response = http.request(method, path, json=body)
            assert response.status_code == status, (body, response.text)
            assert set(response.json()) == {"error"} and words in response.json()["error"], (
                body,
                response.text,
            )
        text = b"not a gguf file at all"
        digest = "sha256:" + hashlib.sha256(text).hexdigest()
        not_gguf = http.post(f"/api/blobs/{digest}", content=text)
        assert not_gguf.status_code == 400 and "not a GGUF" in not_gguf.json()["error"]
        wrong = http.post("/api/blobs/sha256:" + "2" * 64, content=b"GGUF and more")
        assert wrong.status_code == 400 and "digest mismatch" in wrong.json()["error"]
        assert http.head(f"/api/blobs/{digest}").status_code == 404
        bad = http.head("/api/blobs/md5:abc")
        assert bad.status_code == 400
    assert "x" not in served.manifest_entries()


def test_delete_removes_a_blob_once_no_model_uses_it(served: Served) -> None:
    blob = f"sha256:{sha256_file(served.model_path)}"
    blob_file = served.folder / "blobs" / f"sha256-{blob.removeprefix('sha256:')}.gguf"
    with served.client() as client, served.http() as http:
        assert blob_file.is_file()
        client.delete("parrot")  # pirate still serves the same blob
        assert blob_file.is_file() and http.head(f"/api/blobs/{blob}").status_code == 200
        client.delete("pirate:latest")
        assert not blob_file.exists() and http.head(f"/api/blobs/{blob}").status_code == 404
        assert set(served.manifest_entries()) == {"smollm2", "smol-admin"}
        assert (served.folder / "models" / "smollm2.gguf").is_file()  # not a blob: kept
