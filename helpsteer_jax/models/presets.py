"""Published model shapes (from each model's HF `config.json`)."""

from __future__ import annotations

from typing import Any

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models.config import ModelConfig, RopeScaling

_LLAMA2 = dict(vocab_size=32000, rms_norm_eps=1e-5, rope_theta=10000.0,
               max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
_LLAMA3 = dict(vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
               max_position_embeddings=8192, bos_token_id=128000,
               eos_token_id=128001)
_LLAMA3_1 = dict(_LLAMA3, rope_scaling=RopeScaling(),
                 max_position_embeddings=131072,
                 eos_token_id=(128001, 128008, 128009))

PRESETS: dict[str, dict[str, Any]] = {
    # A few-layer model for tests and the CPU demo.
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=176,
                 num_layers=2, num_heads=4, num_kv_heads=2,
                 max_position_embeddings=2048),
    # ~100M-parameter Llama used by the CPU benchmarks.
    "bench_100m": dict(vocab_size=32000, hidden_size=768,
                       intermediate_size=2048, num_layers=8, num_heads=12,
                       num_kv_heads=12),
    "smollm2_135m": dict(vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_layers=30, num_heads=9,
                         num_kv_heads=3, rope_theta=100000.0,
                         max_position_embeddings=8192, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2),
    "llama2_7b": dict(_LLAMA2, hidden_size=4096, intermediate_size=11008,
                      num_layers=32, num_heads=32, num_kv_heads=32),
    "llama2_13b": dict(_LLAMA2, hidden_size=5120, intermediate_size=13824,
                       num_layers=40, num_heads=40, num_kv_heads=40),
    "llama2_70b": dict(_LLAMA2, hidden_size=8192, intermediate_size=28672,
                       num_layers=80, num_heads=64, num_kv_heads=8),
    "llama3_8b": dict(_LLAMA3, hidden_size=4096, intermediate_size=14336,
                      num_layers=32, num_heads=32, num_kv_heads=8),
    "llama3_70b": dict(_LLAMA3, hidden_size=8192, intermediate_size=28672,
                       num_layers=80, num_heads=64, num_kv_heads=8),
    "llama3_1_8b": dict(_LLAMA3_1, hidden_size=4096, intermediate_size=14336,
                        num_layers=32, num_heads=32, num_kv_heads=8),
    "llama3_1_70b": dict(_LLAMA3_1, hidden_size=8192, intermediate_size=28672,
                         num_layers=80, num_heads=64, num_kv_heads=8),
    # Mistral 7B v0.1 (sliding window 4096 is not applied; see ModelConfig).
    "mistral_7b": dict(vocab_size=32000, hidden_size=4096,
                       intermediate_size=14336, num_layers=32, num_heads=32,
                       num_kv_heads=8, rope_theta=10000.0,
                       max_position_embeddings=32768, sliding_window=4096,
                       hf_architecture="MistralForCausalLM",
                       hf_model_type="mistral"),
    "qwen2_7b": dict(vocab_size=152064, hidden_size=3584,
                     intermediate_size=18944, num_layers=28, num_heads=28,
                     num_kv_heads=4, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     max_position_embeddings=32768, attention_bias=True,
                     bos_token_id=None, eos_token_id=151643,
                     hf_architecture="Qwen2ForCausalLM", hf_model_type="qwen2"),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
  """Returns the `ModelConfig` of a named preset, with `overrides` applied."""
  if name not in PRESETS:
    raise ConfigError(
        f"Unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
  return ModelConfig(**{**PRESETS[name], **overrides})
