"""Building the reward model for the attribute-model, evaluation, annotation and build_2d tasks.

The backbone comes from `model.hf_path` (an HF directory, e.g. an AC-SFT
export), from `init.checkpoint` (a training task's workdir or its
`checkpoints` directory: an AC-SFT or attribute-model Orbax checkpoint, of
which only the parameters are read), or a random initialisation. The head
comes from the attribute-model checkpoint (`init.head="auto"`), from a head
file written by a previous run (`init.head=/path/head.npz`), or zeros.
"""

from __future__ import annotations

import os
import pathlib

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from helpsteer_jax import runtime
from helpsteer_jax.data.features import rm as rm_data
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference.scoring import RewardModelScorer
from helpsteer_jax.models import builder
from helpsteer_jax.models.reward import RewardModel, reward_model
from helpsteer_jax.train import checkpoint as ckpt_lib

HEAD_FILE = "head.npz"


def init_config(**overrides) -> ml_collections.ConfigDict:
  """The `config.init` section."""
  cfg = ml_collections.ConfigDict(dict(checkpoint="", head="auto"))
  cfg.update(overrides)
  return cfg


def save_head(path: str | os.PathLike, head_params: dict) -> None:
  """Writes the head (`kernel` [hidden, 9], `bias` [9], attribute names)."""
  host = jax.device_get(head_params)
  tmp = pathlib.Path(f"{path}.tmp.npz")
  np.savez(tmp, kernel=np.asarray(host["kernel"], np.float32),
           bias=np.asarray(host["bias"], np.float32), attributes=np.asarray(ATTRIBUTES))
  tmp.replace(path)


def load_head(path: str | os.PathLike, hidden_size: int) -> dict[str, np.ndarray]:
  try:
    with np.load(path) as f:
      head = {"kernel": f["kernel"].astype(np.float32), "bias": f["bias"].astype(np.float32)}
      names = tuple(str(a) for a in f["attributes"]) if "attributes" in f else ATTRIBUTES
  except (OSError, KeyError, ValueError) as e:
    raise ConfigError(f"init.head={path}: not a head file written by attribute_model"
                      f" ({e})") from None
  want = (hidden_size, len(ATTRIBUTES))
  if head["kernel"].shape != want or head["bias"].shape != want[1:] or names != ATTRIBUTES:
    raise ConfigError(f"init.head={path}: kernel {head['kernel'].shape} / attributes {names}"
                      f" do not fit this model (expected kernel {want}, attributes"
                      f" {ATTRIBUTES})")
  return head


def _restore_from_checkpoint(config, abstract: dict, shardings: dict) -> dict:
  """Params from an Orbax checkpoint; the head only if asked for and present."""
  directory, step = ckpt_lib.find_checkpoint(config.init.checkpoint)
  saved = ckpt_lib.params_metadata(directory, step)
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)
  is_reward_model = "backbone" in saved and "head" in saved
  want = {"backbone": target["backbone"]}
  if is_reward_model and config.init.head == "auto":
    want["head"] = target["head"]
  saved_backbone = saved["backbone"] if is_reward_model else saved
  _check_shapes(saved_backbone, target["backbone"], directory)
  try:
    if is_reward_model:
      restored = ckpt_lib.restore_params(directory, want, step)[0]
    else:
      restored = {"backbone": ckpt_lib.restore_params(directory, want["backbone"], step)[0]}
  except (ValueError, KeyError) as e:
    raise ConfigError(f"cannot initialise from {directory}/{step}: {e}") from None
  logging.info("initialised the %s from %s step %d",
               "backbone and head" if "head" in restored else "backbone", directory, step)
  return restored


def _check_shapes(saved: dict, target: dict, directory: pathlib.Path) -> None:
  flat_saved = dict(jax.tree_util.tree_leaves_with_path(saved))
  for path, leaf in jax.tree_util.tree_leaves_with_path(target):
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    got = flat_saved.get(path)
    if got is None or tuple(got.shape) != tuple(leaf.shape):
      raise ConfigError(
          f"{directory}: parameter {name} is {None if got is None else tuple(got.shape)} in"
          f" the checkpoint but {tuple(leaf.shape)} in this model; set the model shape"
          " (model.preset / model.hf_path / --config.model.hidden_size=...) to the one"
          " that wrote the checkpoint")


def build_reward_model(config: ml_collections.ConfigDict, rt: runtime.Runtime) -> RewardModel:
  """The sharded reward model, initialised as `config.init` says."""
  cfg = runtime.model_config(config)
  builder.validate_model_on_mesh(cfg, rt.mesh, rt.rules)
  graphdef, abstract_state = builder.abstract_module(lambda: reward_model(cfg, config.seed))
  shardings = nnx.to_pure_dict(builder.state_shardings(abstract_state, rt.mesh, rt.rules))
  abstract = nnx.to_pure_dict(abstract_state)
  if config.init.checkpoint:
    params = _restore_from_checkpoint(config, abstract, shardings)
  else:
    backbone = runtime.build_model(config, rt)
    params = {"backbone": nnx.to_pure_dict(nnx.state(backbone, nnx.Param))}
    params["backbone"].pop("lm_head", None)
    del backbone
  if "head" not in params:
    head = config.init.head
    if head not in ("auto", "zeros"):
      params["head"] = load_head(head, cfg.hidden_size)
      logging.info("head initialised from %s", head)
    else:
      params["head"] = jax.tree.map(lambda a: np.zeros(a.shape, np.float32), abstract["head"])
  params = jax.device_put(params, shardings)
  nnx.replace_by_pure_dict(abstract_state, params)
  return nnx.merge(graphdef, abstract_state)


def build_scorer(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                 tokenizer) -> tuple[RewardModelScorer, rm_data.RegressionTokenizer]:
  """The batched scorer over the mesh and the regression tokenizer (`config.score`)."""
  scorer = RewardModelScorer(build_reward_model(config, rt), rt, config.score.batch_size,
                             config.score.pad_multiple)
  return scorer, rm_data.RegressionTokenizer(tokenizer, config.score.max_len,
                                             config.data.truncation, config.data.add_bos)


def require_trained(config: ml_collections.ConfigDict, what: str) -> None:
  """ConfigError unless some trained head will be loaded."""
  if not config.init.checkpoint and config.init.head in ("auto", "zeros"):
    raise ConfigError(f"{what} needs a trained attribute model: set"
                      " --config.init.checkpoint=<attribute_model workdir> (or"
                      " --config.model.hf_path=... with --config.init.head=<head.npz>)")


def score_config(**overrides) -> ml_collections.ConfigDict:
  """The `config.score` section: batched scoring for evaluation and annotation."""
  cfg = ml_collections.ConfigDict(dict(batch_size=16, pad_multiple=64, max_len=4096))
  cfg.update(overrides)
  return cfg


# The demo attribute model's shape (configs/attribute_model.py's default run).
DEMO_SHAPE = dict(hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                  num_kv_heads=2)
SCORING_PRESETS = ("demo", "llama3_70b", "llama3_1_70b", "llama2_13b")


def scoring_preset(config: ml_collections.ConfigDict, preset: str) -> ml_collections.ConfigDict:
  """Model, mesh and scoring settings of the evaluate_rm / annotate presets.

  The demo uses the attribute-model demo's shape (so the demo workdir loads).
  """
  from helpsteer_jax import config_base
  if preset in ("", "demo"):
    config.model = config_base.model_section("tiny", **DEMO_SHAPE)
    config.score.max_len = 256
    return config
  if preset in SCORING_PRESETS:
    config.model = config_base.model_section(preset, dtype="bfloat16", param_dtype="float32")
    config.mesh = config_base.mesh_config(data=1, fsdp=-1, tensor=1)
    config.score.batch_size = 8
    return config
  raise ValueError(f"unknown {config.task} preset {preset!r}; choose one of"
                   f" {', '.join(SCORING_PRESETS)}")
