"""InferFlux: an enterprise-native LLM inference server on llama.cpp."""

__version__ = "0.1.0"
__all__ = ["__version__"]
