"""Published model shapes (from each model's HF `config.json`), by name.

A named model of a family other than Llama starts from that family's knobs
(`families.get(model_type).config_fields()`), so it exports to the right
HF `model_type` and builds the right module.
"""

from __future__ import annotations

from typing import Any

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import families
from helpsteer_jax.models.config import ModelConfig, RopeScaling

_LLAMA2 = dict(vocab_size=32000, rms_norm_eps=1e-5, rope_theta=10000.0,
               max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
_LLAMA3 = dict(vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
               max_position_embeddings=8192, bos_token_id=128000,
               eos_token_id=128001)
_LLAMA3_1 = dict(_LLAMA3, rope_scaling=RopeScaling(),
                 max_position_embeddings=131072,
                 eos_token_id=(128001, 128008, 128009))
# Llama 3.2 1B / 3B: tied embeddings, `llama3` RoPE scaling by 32.
_LLAMA3_2 = dict(_LLAMA3_1, rope_scaling=RopeScaling(factor=32.0), eos_token_id=128001,
                 tie_word_embeddings=True)
_QWEN3 = dict(families.get("qwen3").config_fields(), vocab_size=151936, head_dim=128,
              rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=40960,
              bos_token_id=151643, eos_token_id=151645)
_GEMMA2 = dict(families.get("gemma2").config_fields(), vocab_size=256000, head_dim=256,
               query_pre_attn_scalar=256, attn_logit_softcap=50.0,
               final_logit_softcap=30.0, sliding_window=4096,
               layer_types=("sliding_attention", "full_attention"), rms_norm_eps=1e-6,
               max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=2,
               eos_token_id=1, pad_token_id=0)

SHAPES: dict[str, dict[str, Any]] = {
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
    "llama3_2_1b": dict(_LLAMA3_2, hidden_size=2048, intermediate_size=8192,
                        num_layers=16, num_heads=32, num_kv_heads=8),
    "llama3_2_3b": dict(_LLAMA3_2, hidden_size=3072, intermediate_size=8192,
                        num_layers=28, num_heads=24, num_kv_heads=8),
    # Mistral 7B v0.1: a 4096-token sliding window on every layer.
    "mistral_7b": dict(families.get("mistral").config_fields(), vocab_size=32000,
                       hidden_size=4096, intermediate_size=14336, num_layers=32,
                       num_heads=32, num_kv_heads=8, rope_theta=10000.0,
                       max_position_embeddings=32768, sliding_window=4096),
    "qwen2_7b": dict(families.get("qwen2").config_fields(), vocab_size=152064,
                     hidden_size=3584, intermediate_size=18944, num_layers=28,
                     num_heads=28, num_kv_heads=4, rope_theta=1000000.0,
                     rms_norm_eps=1e-6, max_position_embeddings=32768,
                     bos_token_id=None, eos_token_id=151643),
    "qwen3_0_6b": dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_layers=28,
                       num_heads=16, num_kv_heads=8, tie_word_embeddings=True),
    "qwen3_8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_layers=36,
                     num_heads=32, num_kv_heads=8),
    "gemma2_2b": dict(_GEMMA2, hidden_size=2304, intermediate_size=9216, num_layers=26,
                      num_heads=8, num_kv_heads=4),
    "gemma2_9b": dict(_GEMMA2, hidden_size=3584, intermediate_size=14336, num_layers=42,
                      num_heads=16, num_kv_heads=8),
}


def model_config(name: str, **overrides: Any) -> ModelConfig:
  """Returns the `ModelConfig` of the model `name`, with `overrides` applied."""
  if name not in SHAPES:
    raise ConfigError(f"Unknown model name {name!r}; choose one of {sorted(SHAPES)}")
  return ModelConfig(**{**SHAPES[name], **overrides})
