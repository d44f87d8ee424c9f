"""`load_scorer`: the one way a task gets an attribute scorer, from `config.scorer`.

`scorer.source` names where the attribute model is:

- an attribute_model workdir or its `checkpoints/` (Orbax; shapes read from
  it, family and numerics from `scorer.model`), an HF *ForSequenceClassification
  directory (its HF export), or an HF causal-LM directory with `scorer.head`
  (a head.npz): loaded here and sharded over the mesh (`model.ModelScorer`);
- `http://host:port/v1`: a configs/serve.py server's attribute model, asked by
  process 0 (`remote.HttpScorer`);
- `demo_rules`: the demo data's own rules;
- `package.module:function`: a user's factory, called with `config.scorer`,
  returning a function conversations -> [n, 9] (host-side: each process
  scores its share).

Every one is a `scorer.Scorer`: called on every process with the same
conversations, it returns the same [n, 9] predictions everywhere.
"""

from __future__ import annotations

import importlib
import pathlib

import ml_collections

from helpsteer_jax import config_base, runtime, saved_params
from helpsteer_jax.data.features.rm import RegressionTokenizer
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import hf, reward_hf
from helpsteer_jax.scoring import remote, reward_model, rewards, rules
from helpsteer_jax.scoring.model import ModelScorer
from helpsteer_jax.scoring.scorer import HostScorer, PrimaryScorer, Scorer

ATTRIBUTE_MODEL_RUN = "workdir/attribute_model"  # where the default attribute_model run writes
# The demo attribute model's shape (configs/attribute_model.py's default run).
DEMO_SHAPE = dict(hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                  num_kv_heads=2)


def scorer_section(**overrides) -> ml_collections.ConfigDict:
  """`config.scorer`: the attribute model a task scores with (see `load_scorer`)."""
  section = ml_collections.ConfigDict(dict(
      source="",        # a run, an HF reward dir, a server URL, demo_rules or module:function
      head="",          # with an HF causal-LM directory as the source: its head.npz
      # the family and numerics (a preset's); the shapes are the source's own
      model=config_base.model_section("tiny"),
      tokenizer="",     # "" = the source's (an HF directory's, a run's hf/ or demo tokenizer)
      batch_size=16,    # rows per compiled scoring batch (a server: texts per request)
      max_len=4096,     # longest input in tokens (the largest compiled length)
      truncation="truncate_left",  # or "drop": a longer input is not scored (NaN)
      add_bos=True,
      weights=ml_collections.ConfigDict(rewards.helpsteer2_weights())))
  for key, value in overrides.items():
    section[key] = value
  return section


# Keys the scoring tasks had before `config.scorer` (main.py names the new one).
SCORING_RENAMED = {
    "init.checkpoint": "scorer.source", "init.head": "scorer.head", "model": "scorer.model",
    "model.hf_path": "scorer.source",
    "tokenizer": "scorer.tokenizer", "score.batch_size": "scorer.batch_size",
    "score.max_len": "scorer.max_len",
    "score.pad_multiple": "removed: scoring pads to fixed length buckets (scorer.max_len)",
    "scorer.factory": "scorer.source", "scorer.checkpoint": "scorer.source",
    "scorer.batch": "scorer.batch_size", "data.truncation": "scorer.truncation",
    "data.add_bos": "scorer.add_bos",
}


def is_factory(source: str) -> bool:
  """`package.module:function` (and no such path)."""
  module_name, sep, name = source.partition(":")
  return bool(sep and name.isidentifier()
              and all(part.isidentifier() for part in module_name.split("."))
              and not pathlib.Path(source).exists())


def _factory(section: ml_collections.ConfigDict, key: str):
  module_name, _, name = section.source.partition(":")
  try:
    factory = getattr(importlib.import_module(module_name), name)
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"{key}={section.source!r} cannot be loaded: {e}") from None
  return factory(section)


def tokenizer_dir(section: ml_collections.ConfigDict, key: str) -> str:
  """`scorer.tokenizer`, else the HF source's, else the run's (its hf/ or demo tokenizer)."""
  if section.tokenizer:
    return section.tokenizer
  source = pathlib.Path(section.source).expanduser()
  if section.head or reward_hf.is_reward_dir(source):
    return str(source)
  found = saved_params.run_tokenizer_dir(source)
  if found is None:
    raise ConfigError(f"{key}={section.source}: the run has no tokenizer files (no"
                      f" {saved_params.HF_EXPORT}/ or {saved_params.DEMO_TOKENIZER}/); set"
                      " --config.scorer.tokenizer")
  return str(found)


def model_scorer(section: ml_collections.ConfigDict, rt: runtime.Runtime,
                 key: str = "scorer.source") -> ModelScorer:
  """The attribute model at `section.source` (a path) on `rt`'s mesh."""
  tokenizer = hf.load_tokenizer(tokenizer_dir(section, key))
  model = reward_model.load_reward_model(section.source, rt, section.model, section.head)
  runtime.check_tokenizer_fits(tokenizer, model.cfg.vocab_size,
                               "set --config.scorer.tokenizer to the attribute model's")
  tok = RegressionTokenizer(tokenizer, int(section.max_len), section.truncation,
                            bool(section.add_bos))
  return ModelScorer(model, rt, tok, int(section.batch_size))


def load_scorer(section: ml_collections.ConfigDict, rt: runtime.Runtime | None,
                key: str = "scorer.source") -> Scorer:
  """The scorer `section.source` names; `rt` (the mesh) is needed for a local model."""
  source = str(section.source or "")
  if not source:
    raise ConfigError(f"{key} is empty: give an attribute_model workdir or its HF export"
                      " (<workdir>/hf), a configs/serve.py server's base URL"
                      f" (http://127.0.0.1:8000/v1), {rules.DEMO_RULES}, or"
                      " package.module:function (a factory taking config.scorer and"
                      " returning a function conversations -> [n, 9] predictions)")
  if source == rules.DEMO_RULES:
    return HostScorer(rules.demo_rule_scores)
  if remote.is_url(source):
    return PrimaryScorer(remote.HttpScorer(source, int(section.batch_size)))
  if is_factory(source):
    return HostScorer(_factory(section, key))
  if not pathlib.Path(source).expanduser().exists():
    raise ConfigError(f"{key}={source!r}: no such file or directory, URL or"
                      " package.module:function; give an attribute_model workdir or its HF"
                      " export, a server's base URL (http://host:port/v1), a factory, or"
                      f" {rules.DEMO_RULES}")
  if rt is None:
    raise ValueError("a local attribute model needs the runtime's mesh")
  return model_scorer(section, rt, key)


SCORING_PRESETS = ("demo", "llama3_70b", "llama3_1_70b", "llama2_13b")


def scoring_preset(config: ml_collections.ConfigDict, preset: str) -> ml_collections.ConfigDict:
  """The attribute model's shape, the mesh and the scoring batch of the presets of the tasks
  that score with it (annotate, build_2d, evaluate_rm) or convert it (export_rm: `model`).

  The demo uses the attribute-model demo's shape (so the demo workdir loads).
  """
  model = "scorer" if "scorer" in config else "model"
  if preset in ("", "demo"):
    if model == "scorer":  # the demo run's shapes are read from it
      config.scorer.model = config_base.model_section("tiny")
      config.scorer.max_len = 256
    else:
      config.model = config_base.model_section("tiny", **DEMO_SHAPE)
    return config
  if preset in SCORING_PRESETS:
    section = config_base.model_section(preset, dtype="bfloat16", param_dtype="float32")
    if model == "scorer":
      config.scorer.model = section
      config.scorer.batch_size = 8
    else:
      config.model = section
    config.mesh = config_base.mesh_config(data=1, fsdp=-1, tensor=1)
    return config
  raise config_base.unknown_preset(config.task, preset, SCORING_PRESETS)
