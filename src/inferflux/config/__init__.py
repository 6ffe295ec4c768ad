"""Configuration: the schema (`settings.py`) and the layered loader (`loader.py`)."""

from inferflux.config.loader import load_settings
from inferflux.config.settings import Settings

__all__ = ["Settings", "load_settings"]
