"""Gemma 2: GeGLU, sandwich norms, (1 + w) RMSNorm, soft-capping, local/global layers.

Embeddings are scaled by sqrt(hidden); scores by query_pre_attn_scalar^-1/2
and soft-capped at `attn_logit_softcapping`, logits at
`final_logit_softcapping`; `layer_types` alternates a sliding window
(even layers) with full attention (odd layers). Missing keys take
transformers' Gemma2Config defaults (older config.json files omit some).
"""

from __future__ import annotations

from typing import Any, Mapping

from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.families.base import LLAMA_KNOBS, Family, cyclic, decoder_mappings
from helpsteer_jax.models.families.llama import no_attention_bias
from helpsteer_jax.models.hf_config import check_activation

ALTERNATING = ("sliding_attention", "full_attention")
NORMS = {"input_norm": "input_layernorm", "attn_output_norm": "post_attention_layernorm",
         "post_attention_norm": "pre_feedforward_layernorm",
         "mlp_output_norm": "post_feedforward_layernorm"}
_VARIABLE = ("query_pre_attn_scalar", "attn_logit_softcap", "final_logit_softcap",
             "sliding_window", "layer_types")


def _from_hf(raw: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
  key = "hidden_activation" if "hidden_activation" in raw else "hidden_act"
  check_activation(raw, key, ("gelu_pytorch_tanh",), problems, "gelu_pytorch_tanh")
  no_attention_bias(raw, problems)
  if raw.get("use_bidirectional_attention"):
    problems.append("use_bidirectional_attention=true (the decoder is causal)")
  window = raw.get("sliding_window", 4096)
  return dict(
      head_dim=int(raw.get("head_dim", 256)),
      tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
      query_pre_attn_scalar=raw.get("query_pre_attn_scalar", 256),
      attn_logit_softcap=raw.get("attn_logit_softcapping", 50.0),
      final_logit_softcap=raw.get("final_logit_softcapping", 30.0),
      sliding_window=window,
      layer_types=cyclic(raw.get("layer_types")) or (ALTERNATING if window else None))


def _to_hf(cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
  kinds = cfg.layer_types or ("full_attention",)
  scalar = cfg.query_pre_attn_scalar
  if scalar is not None and float(scalar).is_integer():
    scalar = int(scalar)  # an int in Gemma2Config
  return dict(
      common, hidden_activation="gelu_pytorch_tanh", attention_bias=False,
      query_pre_attn_scalar=scalar,
      attn_logit_softcapping=cfg.attn_logit_softcap,
      final_logit_softcapping=cfg.final_logit_softcap, sliding_window=cfg.sliding_window,
      layer_types=[kinds[i % len(kinds)] for i in range(cfg.num_layers)])


def _mappings(cfg: ModelConfig):
  return decoder_mappings(cfg, NORMS)


_KNOBS = {k: v for k, v in LLAMA_KNOBS.items() if k not in _VARIABLE}
_KNOBS.update(mlp_activation="gelu_tanh", sandwich_norms=True, norm_unit_offset=True,
              scale_embeddings=True)
FAMILY = Family("gemma2", "Gemma2ForCausalLM", _KNOBS, _from_hf, _to_hf,
                param_mappings=_mappings)
