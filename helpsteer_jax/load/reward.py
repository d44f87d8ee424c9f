"""The attribute model (a `RewardModel`): built from where its weights are, and its head file.

`init.source` names them (`weights` tells which kind): a whole trained model is an HF
*ForSequenceClassification directory (the attribute model's HF export; detected by
config.json `architectures`) or an attribute-model Orbax run (a workdir or its
`checkpoints` directory; only the parameters are read, the shapes from its metadata).
Otherwise the backbone comes from an HF causal LM (an AC-SFT export, say), another
task's Orbax run, or a random initialisation, and the head from a head file written by
a previous run (`init.head=/path/head.npz`) or zeros. Tasks reach `build_reward_model`
through `load.model.load_model(..., REWARD)`; `scoring.load.load_reward_model` builds the
config for it from a path alone (the scorers).
"""

from __future__ import annotations

import os
import pathlib

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from helpsteer_jax import runtime, saved_params, weights
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import builder, reward_hf
from helpsteer_jax.models.reward import RewardModel, reward_model

HEAD_FILE = "head.npz"


def save_head(path: str | os.PathLike, head_params: dict) -> None:
  """Writes the head (`kernel` [hidden, 9], `bias` [9] if it has one, attribute names)."""
  host = jax.device_get(head_params)
  arrays = {k: np.asarray(host[k], np.float32) for k in ("kernel", "bias") if k in host}
  tmp = pathlib.Path(f"{path}.tmp.npz")
  np.savez(tmp, attributes=np.asarray(ATTRIBUTES), **arrays)
  tmp.replace(path)


def load_head(path: str | os.PathLike, hidden_size: int) -> dict[str, np.ndarray]:
  """The head of a `save_head` file: `kernel`, and `bias` if it was trained with one."""
  try:
    with np.load(path) as f:
      head = {k: f[k].astype(np.float32) for k in ("kernel", "bias") if k in f}
      names = tuple(str(a) for a in f["attributes"]) if "attributes" in f else ATTRIBUTES
    kernel = head["kernel"]
  except (OSError, KeyError, ValueError) as e:
    raise ConfigError(f"init.head={path}: not a head file written by attribute_model"
                      f" ({e})") from None
  want = (hidden_size, len(ATTRIBUTES))
  bias_ok = "bias" not in head or head["bias"].shape == want[1:]
  if kernel.shape != want or not bias_ok or names != ATTRIBUTES:
    raise ConfigError(f"init.head={path}: kernel {kernel.shape} / attributes {names}"
                      f" do not fit this model (expected kernel {want}, attributes"
                      f" {ATTRIBUTES})")
  return head


def hf_reward_dir(config: ml_collections.ConfigDict) -> str:
  """`init.source` if it is an HF reward-model directory, else ''."""
  path = weights.hf_dir(config.init)
  return path if path and reward_hf.is_reward_dir(path) else ""


def _saved_reward_params(config) -> tuple[pathlib.Path, int, dict, bool]:
  """(directory, step, saved params metadata, whether it is a reward model)."""
  directory, step = saved_params.resolve(weights.orbax_run(config.init), config.init.step)
  saved = saved_params.params_metadata(directory, step)
  return directory, step, saved, "backbone" in saved and "head" in saved


def _restore_from_checkpoint(config, abstract: dict, shardings: dict,
                             source: tuple[pathlib.Path, int, dict, bool]) -> dict:
  """Params from an Orbax checkpoint; the head only if asked for and present."""
  directory, step, saved, is_reward_model = source
  target = sharding_lib.abstract_arrays(abstract, shardings)
  want = {"backbone": target["backbone"]}
  if is_reward_model and config.init.head == "auto":
    want["head"] = target["head"]
  saved_backbone = saved["backbone"] if is_reward_model else saved
  _check_shapes(saved_backbone, target["backbone"], directory)
  try:
    if is_reward_model:
      restored = saved_params.restore_params(directory, want, step)[0]
    else:
      restored = {"backbone": saved_params.restore_params(directory, want["backbone"], step)[0]}
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
          " (model.name / init.source / --config.model.hidden_size=...) to the one"
          " that wrote the checkpoint")


def _head_bias(config: ml_collections.ConfigDict, trained: bool | None, where: str) -> bool:
  """The head layout: the trained head's (`trained`: has a bias) or `config.head_bias`.

  A task that configures `head_bias` (training) must agree with a trained
  head it starts from; scoring tasks follow the trained head.
  """
  wanted = config.get("head_bias")
  if trained is None:
    return bool(wanted)
  if wanted is not None and bool(wanted) != trained:
    raise ConfigError(f"the head from {where} was trained {'with' if trained else 'without'} a"
                      f" bias but head_bias={bool(wanted)}: set --config.head_bias={trained}"
                      " (or start from a head of the other layout)")
  return trained


def build_reward_model(config: ml_collections.ConfigDict, rt: runtime.Runtime) -> RewardModel:
  """The sharded reward model, initialised as `config.init` says.

  The sources: an HF *ForSequenceClassification directory (backbone and
  head), an Orbax checkpoint (an attribute model's: both; any other
  training task's: the backbone), an HF causal-LM directory (the backbone),
  or a random backbone; the head, unless the source holds one, from
  `init.head` (a head file) or zeros.
  """
  cfg = runtime.model_config(config)
  if hf_dir := hf_reward_dir(config):
    builder.validate_model_on_mesh(cfg, rt.mesh, rt.rules)
    if config.init.head != "auto":
      raise ConfigError(f"init.source={hf_dir} holds a trained head; leave init.head=auto")
    reward_hf.reward_config_from_hf(hf_dir)  # the nine attributes as labels
    _head_bias(config, False, hf_dir)
    logging.info("reward model (backbone and head) from %s", hf_dir)
    return nnx.merge(*reward_hf.load_reward_state(hf_dir, cfg, rt.mesh, rt.rules))
  source, head_file, trained = None, None, None
  if weights.orbax_run(config.init):
    source = _saved_reward_params(config)
    if source[3] and config.init.head == "auto":
      trained = "bias" in source[2]["head"]
  builder.validate_model_on_mesh(cfg, rt.mesh, rt.rules)
  if trained is None and config.init.head not in ("auto", "zeros"):
    head_file = load_head(config.init.head, cfg.hidden_size)
    trained = "bias" in head_file
  head_bias = _head_bias(config, trained, config.init.source or config.init.head)
  graphdef, abstract_state = builder.abstract_module(
      lambda: reward_model(cfg, config.seed, head_bias))
  shardings = nnx.to_pure_dict(builder.state_shardings(abstract_state, rt.mesh, rt.rules))
  abstract = nnx.to_pure_dict(abstract_state)
  if source is not None:
    params = _restore_from_checkpoint(config, abstract, shardings, source)
  else:
    backbone = runtime.build_model(config, rt, cfg)
    params = {"backbone": nnx.to_pure_dict(nnx.state(backbone, nnx.Param))}
    params["backbone"].pop("lm_head", None)
    del backbone
  if "head" not in params:
    if head_file is not None:
      params["head"] = head_file
      logging.info("head initialised from %s", config.init.head)
    else:
      params["head"] = jax.tree.map(lambda a: np.zeros(a.shape, np.float32), abstract["head"])
  params = jax.device_put(params, shardings)
  nnx.replace_by_pure_dict(abstract_state, params)
  return nnx.merge(graphdef, abstract_state)


def require_trained(config: ml_collections.ConfigDict, what: str) -> None:
  """ConfigError unless some trained head will be loaded."""
  if hf_reward_dir(config):
    return
  if not weights.orbax_run(config.init) and config.init.head in ("auto", "zeros"):
    raise ConfigError(f"{what} needs a trained attribute model: set"
                      " --config.init.source=<attribute_model workdir or its HF export"
                      " directory> (or an HF backbone with --config.init.head=<head.npz>)")
