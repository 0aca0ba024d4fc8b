"""Model loading: tiny random configs, local HF dirs, hub ids, and the SmolLM2 GGUF."""

from compassplay.models.loading import ModelNotFoundError, load_model

__all__ = ["ModelNotFoundError", "load_model"]
