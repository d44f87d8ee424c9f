"""Llama (1, 2, 3, 3.1, 3.2; SmolLM2, TinyLlama): every family knob off."""

from __future__ import annotations

from typing import Any, Mapping

from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.families.base import LLAMA_KNOBS, Family
from helpsteer_jax.models.hf_config import check_activation

SILU = ("silu", "swish")


def check_llama_like(raw: Mapping[str, Any], problems: list[str]) -> None:
  """The checks Llama, Mistral and Qwen share: a SiLU MLP without biases."""
  check_activation(raw, "hidden_act", SILU, problems, "silu")
  if raw.get("mlp_bias"):
    problems.append("mlp_bias=true (MLP biases are not implemented)")


def no_attention_bias(raw: Mapping[str, Any], problems: list[str]) -> None:
  if raw.get("attention_bias"):
    problems.append("attention_bias=true (HF then also has an o_proj bias, which is not"
                    " implemented)")


def _from_hf(raw: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
  check_llama_like(raw, problems)
  no_attention_bias(raw, problems)
  return {}


def _to_hf(cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
  del cfg
  return dict(common, hidden_act="silu", attention_bias=False, mlp_bias=False,
              pretraining_tp=1)


FAMILY = Family("llama", "LlamaForCausalLM", LLAMA_KNOBS, _from_hf, _to_hf)
