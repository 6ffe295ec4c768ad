"""The HTTP edge: `create_app` builds the FastAPI app over an `EngineClient`."""

from inferflux.api.app import create_app

__all__ = ["create_app"]
