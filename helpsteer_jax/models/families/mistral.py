"""Mistral: Llama with a sliding window on every layer (v0.1: 4096; later: none)."""

from __future__ import annotations

from typing import Any, Mapping

from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.families.base import LLAMA_KNOBS, Family
from helpsteer_jax.models.families.llama import check_llama_like


def _from_hf(raw: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
  check_llama_like(raw, problems)
  if raw.get("layer_types"):
    problems.append("layer_types (alternating attention is Ministral's, not Mistral's)")
  return dict(sliding_window=raw.get("sliding_window"))


def _to_hf(cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
  return dict(common, hidden_act="silu", sliding_window=cfg.sliding_window)


_KNOBS = {k: v for k, v in LLAMA_KNOBS.items() if k != "sliding_window"}
FAMILY = Family("mistral", "MistralForCausalLM", _KNOBS, _from_hf, _to_hf)
