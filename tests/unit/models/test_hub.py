"""ModelHub's pure logic over fake models: routing, LRU, swap and drain, keep_alive, the
manifest diff. The real loads, workers and requests are in tests/integration/test_hot_swap.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inferflux.config.manifest import AdapterEntry, Manifest, ManifestEntry
from inferflux.config.settings import Settings
from inferflux.engine.model_verify import SignatureVerifier
from inferflux.errors import (
    Conflict,
    ModelNotFound,
    ModelVerificationFailed,
    ServiceUnavailable,
)
from inferflux.models.catalog import Catalog
from inferflux.models.hub import ModelHub
from inferflux.models.spec import ModelSpec
from tests.fakes.models import FakeModelLoader

SHA = "ab" * 32


class Harness:
    def __init__(self, tmp_path: Path, max_resident: int = 2) -> None:
        self.settings = Settings.model_validate(
            {"registry": {"max_resident_models": max_resident, "drain_timeout_s": 5}}
        )
        self.loader = FakeModelLoader(self.settings)
        self.folder = tmp_path
        default = self.spec("a", aliases=("alpha",), is_default=True)
        others = (self.spec("b"), self.spec("c"))
        plan = Catalog(
            default=default,
            models_dir=tmp_path,
            verifier=SignatureVerifier((), require=False),
            others=others,
        )
        self.manager = ModelHub(
            self.settings.registry,
            plan,
            self.loader.slot(default),
            self.loader,
        )

    def spec(self, model_id: str, **kwargs: object) -> ModelSpec:
        path = self.folder / f"{model_id}.gguf"
        return ModelSpec(model_id, path, SHA, source="manifest", **kwargs)  # type: ignore[arg-type]

    async def serving_path(self, name: str | None) -> str:
        async with self.manager.lease(name) as serving:
            return serving.model_info.path

    async def serving_path_adapter(self, name: str | None, adapter: str) -> str:
        async with self.manager.lease(name, adapter) as serving:
            return serving.model_info.path

    def states(self) -> dict[str, str]:
        return {v.model_id: v.state for v in self.manager.models() if v.state != "retiring"}

    async def settle(self) -> None:
        """Let background retirements run to completion."""
        for _ in range(20):
            await asyncio.sleep(0)
        while self.manager.residency.busy:  # background retirements and preloads
            await asyncio.sleep(0.01)


def entry(model_id: str, path: str, **fields: object) -> ManifestEntry:
    return ManifestEntry.model_validate({"id": model_id, "path": path, "sha256": SHA, **fields})


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


async def test_requests_route_by_id_alias_and_ollama_tag(h: Harness) -> None:
    assert (await h.serving_path(None)).endswith("a.gguf")
    assert (await h.serving_path("")).endswith("a.gguf")
    assert (await h.serving_path("alpha")).endswith("a.gguf")
    assert (await h.serving_path("alpha:latest")).endswith("a.gguf")
    assert (await h.serving_path("b")).endswith("b.gguf")  # loaded on first use
    assert h.loader.loads == ["b"]
    with pytest.raises(ModelNotFound, match="^model 'zzz' not found$"):
        await h.serving_path("zzz")


async def test_concurrent_first_requests_share_one_load(h: Harness) -> None:
    h.loader.gate = asyncio.Event()
    waiting = [asyncio.create_task(h.serving_path("b")) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert h.states()["b"] == "loading"
    h.loader.gate.set()
    assert all(path.endswith("b.gguf") for path in await asyncio.gather(*waiting))
    assert h.loader.loads == ["b"]


async def test_lru_retires_the_least_recently_used_idle_model_never_the_default(
    h: Harness,
) -> None:
    await h.serving_path("b")
    await h.serving_path("c")  # max 2 resident: b (idle, not default) makes room
    await h.settle()
    assert h.states() == {"a": "loaded", "b": "registered", "c": "loaded"}
    assert h.loader.engines["b.gguf"].stopped and not h.loader.engines["a.gguf"].stopped
    await h.serving_path("b")  # back on demand; c goes
    await h.settle()
    assert h.states() == {"a": "loaded", "b": "loaded", "c": "registered"}


async def test_a_busy_model_is_never_evicted(h: Harness) -> None:
    async with h.manager.lease("b"):
        with pytest.raises(ServiceUnavailable, match="registry.max_resident_models 2"):
            await h.serving_path("c")
    assert h.states()["b"] == "loaded"


async def test_swap_switches_new_requests_and_drains_the_old_model(h: Harness) -> None:
    async with h.manager.lease("a") as old:
        result = await h.manager.swap(entry("a", "a2.gguf", aliases=["alpha"]))
        assert result.retiring == "a" and result.load_s is not None
        # new requests get the new file at once; the held request still has the old one
        assert (await h.serving_path("alpha")).endswith("a2.gguf")
        assert old.model_info.path.endswith("a.gguf")
        await asyncio.sleep(0.05)
        assert not h.loader.engines["a.gguf"].stopped  # drains first
        assert [v.state for v in h.manager.models() if v.model_id == "a"] == ["loaded", "retiring"]
    await h.settle()
    assert h.loader.engines["a.gguf"].stopped and not h.loader.engines["a2.gguf"].stopped
    assert h.manager.default_serving().model_info.path.endswith("a2.gguf")  # the default follows


async def test_a_failed_swap_leaves_the_old_model_serving(h: Harness) -> None:
    h.loader.fail["bad.gguf"] = ModelVerificationFailed("does not match its SHA-256")
    with pytest.raises(ModelVerificationFailed):
        await h.manager.swap(entry("a", "bad.gguf"))
    assert (await h.serving_path(None)).endswith("a.gguf")
    assert not h.loader.engines["a.gguf"].stopped
    (view,) = [v for v in h.manager.models() if v.model_id == "a"]
    assert view.state == "loaded" and view.error == "does not match its SHA-256"


async def test_swap_and_load_refuse_conflicts_before_loading(h: Harness) -> None:
    with pytest.raises(ModelNotFound, match="use action load"):
        await h.manager.swap(entry("new", "new.gguf"))
    with pytest.raises(Conflict, match="use action swap"):
        await h.manager.load(entry("b", "b2.gguf"))
    with pytest.raises(Conflict, match="'alpha' already routes to model 'a'"):
        await h.manager.load(entry("d", "d.gguf", aliases=["alpha"]))
    with pytest.raises(Conflict, match="'alpha' already routes"):
        await h.manager.swap(entry("b", "b2.gguf", aliases=["alpha"]))
    with pytest.raises(ModelVerificationFailed, match="outside the models folder"):
        await h.manager.load(entry("d", "../d.gguf"))
    assert h.loader.loads == []


async def test_load_registers_and_can_make_the_default(h: Harness) -> None:
    result = await h.manager.load(entry("d", "d.gguf", default=True))
    assert result.load_s is not None and h.loader.loads == ["d"]
    assert (await h.serving_path(None)).endswith("d.gguf")
    views = {v.model_id: v for v in h.manager.models()}
    assert views["d"].is_default and views["d"].source == "admin"
    assert not views["a"].is_default


async def test_repeating_a_load_is_idempotent(h: Harness) -> None:
    first = await h.manager.load(entry("d", "d.gguf"))
    again = await h.manager.load(entry("d", "d.gguf"))
    assert first.load_s is not None and again.load_s is None and h.loader.loads == ["d"]
    await h.manager.unload("d")
    await h.settle()
    reloaded = await h.manager.load(entry("d", "d.gguf"))  # unloaded, still registered
    assert reloaded.load_s is not None and h.loader.loads == ["d", "d"]


async def test_unload(h: Harness) -> None:
    with pytest.raises(Conflict, match="is the default"):
        await h.manager.unload("alpha")
    await h.serving_path("b")
    result = await h.manager.unload("b")
    assert result.retiring == "b"
    await h.settle()
    assert h.states()["b"] == "registered" and h.loader.engines["b.gguf"].stopped
    assert (await h.serving_path("b")).endswith("b.gguf")  # still registered: loads again
    with pytest.raises(ModelNotFound):
        await h.manager.unload("zzz")


async def test_set_default_loads_first_then_frees_the_old_default(h: Harness) -> None:
    result = await h.manager.set_default("c")
    assert result.action == "set_default" and h.loader.loads == ["c"]
    assert (await h.serving_path(None)).endswith("c.gguf")
    await h.manager.unload("a")
    await h.settle()
    assert h.loader.engines["a.gguf"].stopped


async def test_keep_alive_unloads_once_idle(h: Harness) -> None:
    async with h.manager.lease("b"):
        h.manager.keep_alive("b", 0)
        h.manager.residency.unload_expired("a")  # the housekeeping tick (the default: a)
        assert h.states()["b"] == "loaded"  # busy: kept
    h.manager.residency.unload_expired("a")
    await h.settle()
    assert h.states()["b"] == "registered"
    h.manager.keep_alive("a", 0)  # the default is never unloaded
    h.manager.residency.unload_expired("a")
    assert h.states()["a"] == "loaded"
    await h.serving_path("b")
    h.manager.keep_alive("b", 3600)
    (view,) = [v for v in h.manager.models() if v.model_id == "b"]
    assert view.expires_in_s is not None and 3500 < view.expires_in_s <= 3600


async def test_the_manifest_diff_loads_swaps_and_removes(h: Harness) -> None:
    h.manager.lifecycle.applied = {e.id: e for e in (entry("a", "a.gguf"), entry("b", "b.gguf"))}
    changed = Manifest(models=(entry("a", "a.gguf"), entry("b", "b2.gguf"), entry("d", "d.gguf")))
    await h.manager.sync_manifest(changed)
    await h.settle()
    assert set(h.loader.loads) == {"b", "d"}
    assert (await h.serving_path("b")).endswith("b2.gguf")
    assert (await h.serving_path("d")).endswith("d.gguf")
    await h.manager.sync_manifest(Manifest(models=(entry("a", "a.gguf"),)))
    await h.settle()
    with pytest.raises(ModelNotFound):
        await h.serving_path("d")
    assert h.loader.engines["d.gguf"].stopped
    # c was never in the applied manifest: the watcher leaves it alone
    assert "c" in h.states()


async def test_a_bad_manifest_entry_is_reported_not_raised(h: Harness) -> None:
    h.loader.fail["broken.gguf"] = ModelVerificationFailed("does not match its SHA-256")
    manifest = Manifest(models=(entry("a", "a.gguf"), entry("e", "broken.gguf")))
    await h.manager.sync_manifest(manifest)
    views = {v.model_id: v for v in h.manager.models()}
    assert views["e"].state == "failed" and views["e"].error == "does not match its SHA-256"
    assert views["a"].state == "loaded"


async def test_workers_are_numbered_across_models_and_shutdown_stops_all(h: Harness) -> None:
    await h.serving_path("b")
    assert [w.worker_id for w in h.manager.workers()] == [0, 1]
    await h.manager.shutdown()
    assert h.loader.engines["a.gguf"].stopped and h.loader.engines["b.gguf"].stopped


def adapter(adapter_id: str, base: str, path: str, **fields: object) -> AdapterEntry:
    return AdapterEntry.model_validate(
        {"id": adapter_id, "base": base, "path": path, "sha256": SHA, **fields}
    )


async def test_an_adapter_is_a_model_of_its_own_named_base_colon_adapter(h: Harness) -> None:
    result = await h.manager.load_adapter(adapter("pirate", "alpha", "pirate.gguf", scale=0.5))
    assert result.model_id == "a:pirate" and h.loader.loads == ["a:pirate"]
    async with (
        h.manager.lease("a:pirate") as by_name,
        h.manager.lease("alpha", "pirate") as by_field,
    ):
        assert by_name is by_field
        (lora,) = by_name.model_info.adapters
        assert (lora.adapter_id, lora.scale) == ("pirate", 0.5)
        assert by_name.model_info.path.endswith("a.gguf")  # the base's file
    async with h.manager.lease(None) as base:
        assert base.model_info.adapters == ()  # the base model is untouched
    with pytest.raises(ModelNotFound, match="'a:nope' not found"):
        await h.serving_path_adapter("a", "nope")
    views = {v.model_id: v for v in h.manager.models()}
    assert views["a:pirate"].adapter_of == "a" and not views["a:pirate"].is_default


async def test_adapter_conflicts_swap_and_unload(h: Harness) -> None:
    await h.manager.load_adapter(adapter("pirate", "a", "pirate.gguf"))
    with pytest.raises(Conflict, match="use action swap"):
        await h.manager.load_adapter(adapter("pirate", "a", "pirate2.gguf"))
    with pytest.raises(Conflict, match="already is an adapter model"):
        await h.manager.load_adapter(adapter("x", "a:pirate", "x.gguf"))
    with pytest.raises(ModelNotFound):
        await h.manager.load_adapter(adapter("x", "zzz", "x.gguf"))
    with pytest.raises(ModelVerificationFailed, match="outside the models folder"):
        await h.manager.load_adapter(adapter("x", "a", "../x.gguf"))
    async with h.manager.lease("a:pirate") as old:
        result = await h.manager.load_adapter(adapter("pirate", "a", "p2.gguf"), replace=True)
        assert result.action == "swap" and result.retiring == "a:pirate"
        async with h.manager.lease("a:pirate") as new:
            assert new.model_info.adapters[0].path.endswith("p2.gguf")
        assert old.model_info.adapters[0].path.endswith("pirate.gguf")
    await h.manager.unload("a:pirate", forget=True)
    await h.settle()
    with pytest.raises(ModelNotFound):
        await h.serving_path("a:pirate")


async def test_shutdown_during_a_retirement_still_stops_the_old_model(h: Harness) -> None:
    async with h.manager.lease("a"):
        await h.manager.swap(entry("a", "a2.gguf"))
        await asyncio.sleep(0.01)  # the old one drains: held by this request
        await h.manager.shutdown()
    assert h.loader.engines["a.gguf"].stopped and h.loader.engines["a2.gguf"].stopped
