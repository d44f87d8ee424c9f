"""Qwen3: Llama with an RMSNorm on each query and key head before RoPE.

No QKV bias (unlike Qwen2) and an explicit head_dim (128 in every dense
Qwen3, whatever the width).
"""

from __future__ import annotations

from typing import Any, Mapping

from helpsteer_jax.models.families.base import LLAMA_KNOBS, Family
from helpsteer_jax.models.families.llama import check_llama_like, no_attention_bias
from helpsteer_jax.models.families.qwen2 import no_qwen_window, qwen_to_hf


def _from_hf(raw: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
  check_llama_like(raw, problems)
  no_attention_bias(raw, problems)
  no_qwen_window(raw, problems, "Qwen3")
  return dict(head_dim=int(raw.get("head_dim", 128)))


FAMILY = Family("qwen3", "Qwen3ForCausalLM", dict(LLAMA_KNOBS, qk_norm=True), _from_hf,
                qwen_to_hf)
