"""Llama-family decoder, presets, and Hugging Face checkpoint conversion."""

from helpsteer_jax.models.config import ModelConfig, RopeScaling
from helpsteer_jax.models.llama import Llama
from helpsteer_jax.models.presets import PRESETS, get_preset

__all__ = ["Llama", "ModelConfig", "PRESETS", "RopeScaling", "get_preset"]
