"""The reward model as a Hugging Face *ForSequenceClassification directory.

Export writes the backbone under the family's tensor names (no `lm_head`)
and the head as `score.weight` [9, hidden]; `config.json` is the family's
with `architectures` = [<Family>ForSequenceClassification], `id2label` = the
nine attribute names, `problem_type="regression"` and a `pad_token_id`, so
`transformers.AutoModelForSequenceClassification` loads it and reads each
row's last non-pad token: the token `RewardModel.score_last` reads (the last
token of `<extra_id_2>` in the regression format).

transformers' `score` layer has no bias, and a bias cannot be folded into
the kernel: the head sees the final-norm hidden state, which has no
constant component to carry it. A head trained with a bias is therefore
refused. Import reads such a directory (ours or one transformers wrote)
into a `RewardModel` with a bias-free head.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.data import template
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import builder, hf
from helpsteer_jax.models import safetensors_io as st
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.families.base import ParamMapping
from helpsteer_jax.models.reward import NUM_ATTRIBUTES, RewardModel, reward_model

SEQUENCE_CLASSIFICATION = "ForSequenceClassification"
CAUSAL_LM = "ForCausalLM"
SCORE = "score.weight"
BIAS_REFUSED = (
    "the attribute model's head has a bias, which transformers' *ForSequenceClassification"
    " `score` layer lacks (and which cannot be folded into its kernel); train with"
    " --config.head_bias=False to export, or keep this model in its Orbax checkpoint"
    " (--config.train.export_hf=False)")


def is_reward_dir(path: str | os.PathLike) -> bool:
  """True for an HF directory whose config.json names a *ForSequenceClassification model."""
  config = pathlib.Path(path).expanduser() / "config.json"
  if not config.is_file():
    return False
  try:
    architectures = json.loads(config.read_text()).get("architectures") or []
  except (OSError, ValueError, AttributeError):
    return False
  return bool(architectures) and str(architectures[0]).endswith(SEQUENCE_CLASSIFICATION)


def reward_mappings(cfg: ModelConfig) -> list[ParamMapping]:
  """Every `RewardModel` parameter with its HF name: the family's backbone, then `score`."""
  backbone = [dataclasses.replace(m, path=("backbone",) + m.path)
              for m in hf.param_mappings(cfg) if m.path != ("lm_head",)]
  head = ParamMapping(("head", "kernel"), SCORE, ((cfg.hidden_size,), (NUM_ATTRIBUTES,)),
                      transpose=True)
  return backbone + [head]


def _readout_token(tokenizer: Any) -> int:
  """The id `score_last` reads: the last token of a regression-format text."""
  conv = Conversation(template.DEFAULT_SYSTEM, (Turn("User", "Hi"), Turn("Assistant", "Hello")))
  ids = tokenizer(template.regression_text(conv), add_special_tokens=False)["input_ids"]
  return int(ids[-1])


def pad_token_id(cfg: ModelConfig, tokenizer: Any = None) -> int:
  """The pad id the export declares: the model's, the tokenizer's, the first EOS, else 0.

  It must differ from the token the model reads, or transformers would read
  an earlier one; with a tokenizer that is checked.
  """
  eos = cfg.eos_token_id[0] if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id
  tok_pad = getattr(tokenizer, "pad_token_id", None)
  pad = next((p for p in (cfg.pad_token_id, tok_pad, eos, 0) if p is not None))
  if tokenizer is not None and int(pad) == _readout_token(tokenizer):
    raise ConfigError(f"pad token id {pad} is the token the attribute model reads (the last"
                      f" token of {template.LABEL_START!r}); transformers would read the token"
                      " before it. Set --config.model.pad_token_id to another id")
  return int(pad)


def reward_config_to_hf(cfg: ModelConfig, dtype: str, pad_id: int) -> dict[str, Any]:
  """The family's config.json as a nine-output regression *ForSequenceClassification."""
  raw = hf.config_to_hf(cfg, dtype)
  base = cfg.hf_architecture.removesuffix(CAUSAL_LM)
  raw.update(architectures=[base + SEQUENCE_CLASSIFICATION],
             id2label={str(i): name for i, name in enumerate(ATTRIBUTES)},
             label2id={name: i for i, name in enumerate(ATTRIBUTES)},
             problem_type="regression", pad_token_id=pad_id)
  return raw


def save_reward_hf(model: RewardModel, out_dir: str | os.PathLike, dtype: str = "bfloat16",
                   tokenizer: Any = None, max_shard_bytes: int = 5 * 2**30) -> list[str]:
  """Writes `model` as an HF *ForSequenceClassification directory; returns the files.

  `tokenizer` (a directory, or an object with `save_pretrained`) is copied
  and decides the pad id when the model config has none. Every process
  calls this (collective gathers); process 0 writes.
  """
  if model.head.has_bias:
    raise ConfigError(f"cannot export to {out_dir}: {BIAS_REFUSED}")
  cfg = model.cfg
  tok = hf.load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
  config = reward_config_to_hf(cfg, dtype, pad_token_id(cfg, tok))
  order = hf.tensor_order(reward_mappings(cfg), cfg.num_layers)
  return hf.write_checkpoint(model, order, config, None, out_dir, dtype, max_shard_bytes,
                             tokenizer)


def reward_config_from_hf(path: str | os.PathLike, **overrides: Any) -> ModelConfig:
  """The backbone's `ModelConfig`; ConfigError unless the labels are the nine attributes."""
  raw = hf.read_hf_config(path)
  labels = raw.get("id2label") or {}
  names = [labels[k] for k in sorted(labels, key=int)] if labels else []
  if tuple(names) != ATTRIBUTES:
    raise ConfigError(f"{path}: a sequence classifier with labels {names or '(none)'}; an"
                      f" attribute model has id2label = the nine attributes {ATTRIBUTES} in"
                      " this order (export one with the attribute_model or export_rm task)")
  return hf.config_from_hf(raw, **overrides)


def load_reward_state(path: str | os.PathLike, cfg: ModelConfig, mesh: Mesh,
                      rules: sharding_lib.Rules = sharding_lib.DEFAULT_RULES,
                      ) -> tuple[nnx.GraphDef, nnx.State]:
  """A `RewardModel` (bias-free head) sharded on `mesh`, read as `hf.load_hf_state` reads."""
  reader = st.CheckpointReader(path)
  if "score.bias" in reader:
    raise ConfigError(f"{path} has a score.bias tensor, which transformers'"
                      " *ForSequenceClassification models do not read; this is not a"
                      " transformers sequence-classification checkpoint")
  maps = reward_mappings(cfg)
  hf.check_tensors(reader, hf.tensor_order(maps, cfg.num_layers), frozenset({"lm_head.weight"}))
  graphdef, abstract = builder.abstract_module(lambda: reward_model(cfg, head_bias=False))
  return graphdef, hf.read_params(reader, maps, cfg.num_layers, abstract, mesh, rules)


def load_reward_hf(path: str | os.PathLike, mesh: Mesh | None = None,
                   rules: sharding_lib.Rules = sharding_lib.DEFAULT_RULES,
                   **config_overrides: Any) -> RewardModel:
  """A `RewardModel` from an HF sequence-classification directory (one device by default)."""
  if mesh is None:
    mesh = sharding_lib.make_mesh((1, 1, 1), jax.devices()[:1])
  cfg = reward_config_from_hf(path, **config_overrides)
  builder.validate_model_on_mesh(cfg, mesh, rules)
  return nnx.merge(*load_reward_state(path, cfg, mesh, rules))
