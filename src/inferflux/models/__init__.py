"""Models: which ones exist, which are resident, and their lifecycle (load, swap, unload,
adapters), under one vocabulary (docs/architecture.md, "Glossary").

`ModelHub` (hub.py) implements the two seams of protocol.py over `NameTable` (names.py),
`Residency` (residency.py) and `Lifecycle` (lifecycle.py); a resident model is a
`ResidentModel` (resident.py) whose `ServingState` (serving.py) is what the API uses.
"""

from inferflux.models.catalog import Catalog, catalog_from_settings, single_model_catalog
from inferflux.models.hub import ModelHub
from inferflux.models.protocol import LifecycleResult, ModelDirectory, ModelLifecycle, ModelView
from inferflux.models.resident import ResidentModel, build_serving, system_fingerprint
from inferflux.models.serving import (
    ClientEngine,
    EngineWrapper,
    ServedEngine,
    ServingState,
    WrappingEngine,
)
from inferflux.models.spec import ModelSpec

__all__ = [
    "Catalog",
    "ClientEngine",
    "EngineWrapper",
    "LifecycleResult",
    "ModelDirectory",
    "ModelHub",
    "ModelLifecycle",
    "ModelSpec",
    "ModelView",
    "ResidentModel",
    "ServedEngine",
    "ServingState",
    "WrappingEngine",
    "build_serving",
    "catalog_from_settings",
    "single_model_catalog",
    "system_fingerprint",
]
