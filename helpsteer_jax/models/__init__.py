"""The decoder, its model families, presets, and Hugging Face checkpoint conversion."""

from helpsteer_jax.models.config import ModelConfig, RopeScaling
from helpsteer_jax.models.decoder import Decoder
from helpsteer_jax.models.presets import PRESETS, get_preset

__all__ = ["Decoder", "ModelConfig", "PRESETS", "RopeScaling", "get_preset"]
