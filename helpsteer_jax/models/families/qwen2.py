"""Qwen2 (and 2.5): Llama with biases on q, k and v."""

from __future__ import annotations

from typing import Any, Mapping

from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.families.base import LLAMA_KNOBS, Family
from helpsteer_jax.models.families.llama import check_llama_like


def no_qwen_window(raw: Mapping[str, Any], problems: list[str], name: str) -> None:
  if raw.get("use_sliding_window"):
    problems.append(f"use_sliding_window=true ({name} sliding-window attention (windows from"
                    " max_window_layers on) is not implemented)")


def qwen_to_hf(cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
  del cfg
  return dict(common, hidden_act="silu", use_sliding_window=False, sliding_window=None)


def _from_hf(raw: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
  check_llama_like(raw, problems)
  no_qwen_window(raw, problems, "Qwen2")
  return {}


def _to_hf(cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
  out = qwen_to_hf(cfg, common)
  if cfg.head_dim == cfg.hidden_size // cfg.num_heads:
    del out["head_dim"]  # not a Qwen2Config field; implied
  return out


FAMILY = Family("qwen2", "Qwen2ForCausalLM", dict(LLAMA_KNOBS, attention_bias=True),
                _from_hf, _to_hf)
