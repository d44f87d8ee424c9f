"""The config layer's sections beyond the base: training, decoding, steering, scoring.

With `config_base`, the only modules a task file (`configs/*.py`) imports:
they load no JAX and no runtime module (the sections are plain ConfigDicts,
their defaults plain values), so loading a config and `--help` stay quick.
The runtime modules read these sections; the defaults they share with the
runtime (the stop strings, HelpSteer2's reward weights) are defined here.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from helpsteer_jax import config_base
from helpsteer_jax.data.records import ASPECTS_2D, ATTRIBUTES
from helpsteer_jax.data.template import DEFAULT_SYSTEM, TURN_START

# The names of models/catalog.py's published model shapes (tests/test_catalog.py keeps them
# equal).
MODEL_NAMES = ("tiny", "bench_100m", "smollm2_135m", "llama2_7b", "llama2_13b", "llama2_70b",
               "llama3_8b", "llama3_70b", "llama3_1_8b", "llama3_1_70b", "llama3_2_1b",
               "llama3_2_3b", "mistral_7b", "qwen2_7b", "qwen3_0_6b", "qwen3_8b", "gemma2_2b",
               "gemma2_9b")

# Generation ends at the next turn marker (NeMo's SteerLM template).
DEFAULT_STOP_STRINGS = (TURN_START,)

# HelpSteer2's reward (Llama3-70B-SteerLM-RM): helpfulness, correctness, coherence and
# complexity count for, verbosity against; the OpenAssistant attributes not at all.
HELPSTEER2_WEIGHTS = {"helpfulness": 0.65, "correctness": 0.8, "coherence": 0.45,
                      "complexity": 0.55, "verbosity": -0.4}


def helpsteer2_weights() -> dict[str, float]:
  """HelpSteer2's weights for all nine attributes (a config section's default)."""
  return {name: HELPSTEER2_WEIGHTS.get(name, 0.0) for name in ATTRIBUTES}


# ---------------------------------------------------------------- training


def train_config(**overrides: Any) -> ml_collections.ConfigDict:
  """The `config.train` section (train/loop.py, train/run_loop.py)."""
  section = ml_collections.ConfigDict(dict(
      num_steps=100, global_batch=8, micro_batch=8, seq_len=512,
      log_every=10, eval_every=50, eval_batches=0, save_every=50,
      keep_checkpoints=2, async_checkpoint=True, peak_flops=0.0,
      cpu_peak_gflops=190.0, export_hf=True, export_merged=False, export_dtype="bfloat16",
      # An eval metric (e.g. "loss"; rl: "reward"): export the best evaluated step instead
      # of the last, its checkpoint kept besides the latest keep_checkpoints; "" = the last
      export_best="",
      export_best_mode="",  # export_best's direction: "max" or "min" (which is better)
      loss_chunk_size=256, max_consecutive_nonfinite=8))
  section.update(overrides)
  return section


def optimizer_config(**overrides: Any) -> ml_collections.ConfigDict:
  """The `config.optimizer` section (train/optim.py; NeMo-Aligner SFT defaults)."""
  section = ml_collections.ConfigDict(dict(
      lr=1e-4, min_lr=1e-5, schedule="cosine", warmup_steps=10, constant_steps=0,
      weight_decay=0.01, b1=0.9, b2=0.98, eps=1e-8, grad_clip=1.0))
  section.update(overrides)
  return section


def init_config(**overrides) -> ml_collections.ConfigDict:
  """`config.init` of the tasks that train or export the attribute model: also the head."""
  return config_base.init_section(**{"head": "auto", **overrides})


# ---------------------------------------------------------------- generation


def steer_config(**overrides: int) -> ml_collections.ConfigDict:
  """The `config.steer` section: one 0..4 value per attribute, unset (None) by default."""
  fields = {name: ml_collections.config_dict.placeholder(int) for name in ATTRIBUTES}
  section = ml_collections.ConfigDict(fields)
  section.update(overrides)
  return section


GENERATION_PRESETS = ("demo", "llama2_70b", "llama3_70b", "llama3_8b", "smollm2_135m")


def generation_config(task: str, preset: str = "") -> ml_collections.ConfigDict:
  """`task`'s base config with the model of `preset` and the decoding settings.

  The default preset is the `tiny` model of the default AC-SFT run (its
  checkpoints carry their own shapes); the others load bf16 weights
  tensor-parallel over every device.
  """
  config = config_base.base_config(task)
  config.system = DEFAULT_SYSTEM
  config.batch_size = 16
  config.max_new_tokens = 128
  config.max_length = 0        # KV cache length; 0 = the model's max_position_embeddings
  config.add_bos = True
  config.stop_strings = tuple(DEFAULT_STOP_STRINGS)
  config.sampling = ml_collections.ConfigDict(dict(temperature=0.0, top_k=0, top_p=1.0))
  # Unset values and an empty steer_attributes take the model's own (the `steerlm`
  # section of its export), else NeMo's defaults for all nine attributes.
  config.steer = steer_config()
  config.steer_attributes = ""  # "", "all", "helpsteer" or a comma-separated list
  if preset in ("", "demo"):
    config.model = config_base.model_section("tiny")
    return config
  if preset in GENERATION_PRESETS:
    # bfloat16 on accelerators, float32 on CPU (runtime.decode_dtype says why).
    config.model = config_base.model_section(preset, dtype="auto", param_dtype="auto")
    config.mesh = config_base.mesh_config(data=1, fsdp=1, tensor=-1)
    config.max_new_tokens = 512
    config.max_length = 4096
    config.require_weights = preset != "smollm2_135m"
    return config
  raise config_base.unknown_preset(task, preset, GENERATION_PRESETS)


# ---------------------------------------------------------------- preference training

def preference_data_config(**overrides: Any) -> ml_collections.ConfigDict:
  """`config.data` of the pair-training tasks (dpo2d, iterative_dpo)."""
  return config_base.data_config(
      packing=False, fixed_shape=True,
      max_segments=16,        # segments per response (pairs with more are dropped, counted)
      score_max=4.0,          # scores are divided by this (the normalise of r = W . s)
      response_label="",      # SteerLM attribute string for the response turn ("" = none)
      demo_train_pairs=512, demo_validation_pairs=64, **overrides)


def preference_loss_config(**overrides: Any) -> ml_collections.ConfigDict:
  """`config.loss` of the pair-training tasks (losses/dpo2d.py's settings)."""
  section = ml_collections.ConfigDict(dict(
      loss_type="dpo2d", beta=0.1, grouped=True, label_smoothing=0.0,
      aspects=ASPECTS_2D, aspect_weights=(0.2, 0.2, 0.2, 0.2, 0.2),
      vocab_chunk_size=0))  # > 0: project over vocabulary chunks (large vocabularies)
  section.update(overrides)
  return section


def reference_config(**overrides: Any) -> ml_collections.ConfigDict:
  """`config.reference`: how the pair-training tasks get the reference log-probs."""
  section = ml_collections.ConfigDict(dict(
      mode="cached",   # "cached": first pass, saved under cache_dir; "on_the_fly": in the step
      cache_dir="",    # "" = <workdir>/reference
      batch=0))        # pairs per batch of the first pass (0 = train.micro_batch)
  section.update(overrides)
  return section


# ---------------------------------------------------------------- aligning a policy

ACSFT_RUN = "workdir/acsft"  # where the default AC-SFT run writes: the demo policies' start


def demo_policy(config: ml_collections.ConfigDict, **train: Any) -> ml_collections.ConfigDict:
  """The demo AC-SFT run's tiny policy as the start of an aligning task (rl, steerlm2,
  iterative_dpo), and its `train` section with `train` overrides."""
  config.model = config_base.model_section("tiny", **DEMO_SHAPE, attention_block_size=64)
  config.init.source = ACSFT_RUN
  config.train = train_config(**{"seq_len": 192, "export_dtype": "float32",
                                 "loss_chunk_size": 64, **train})
  return config


def scorer_on_mesh(config: ml_collections.ConfigDict, preset: str) -> None:
  """A large preset's attribute model: of the policy's family, on the mesh, in bf16
  (scoring only), with no default source (it must be given)."""
  config.scorer.source = ""
  config.scorer.model = config_base.model_section(preset, dtype="bfloat16",
                                                 param_dtype="bfloat16")
  config.scorer.batch_size = 16


def rounds_sampling_config(**overrides: Any) -> ml_collections.ConfigDict:
  """`config.sampling` of the iterated tasks (steerlm2, iterative_dpo): the answers each
  round samples per prompt."""
  section = ml_collections.ConfigDict(dict(
      responses=4,          # answers per prompt (SteerLM 2.0's group, DPO's candidates)
      max_new_tokens=64,
      temperature=1.0, top_p=1.0, top_k=0,
      batch_prompts=32,     # prompts per sampling batch (a resume point each)
      max_batch=0,          # engine rows; 0 = batch_prompts x responses
      stop_strings=tuple(DEFAULT_STOP_STRINGS)))
  section.update(overrides)
  return section


# ---------------------------------------------------------------- scoring


ATTRIBUTE_MODEL_RUN = "workdir/attribute_model"  # where the default attribute_model run writes
# The demo attribute model's shape (configs/attribute_model.py's default run).
DEMO_SHAPE = dict(hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                  num_kv_heads=2)


def scorer_section(**overrides) -> ml_collections.ConfigDict:
  """`config.scorer`: the attribute model a task scores with (see `load_scorer`)."""
  section = ml_collections.ConfigDict(dict(
      source="",        # a run, an HF reward dir, a server URL, demo_rules or module:function
      head="",          # with an HF causal-LM directory as the source: its head.npz
      # the family and numerics (a named model's); the shapes are the source's own
      model=config_base.model_section("tiny"),
      tokenizer="",     # "" = the source's (an HF directory's, a run's hf/ or demo tokenizer)
      batch_size=16,    # rows per compiled scoring batch (a server: texts per request)
      max_len=4096,     # longest input in tokens (the largest compiled length)
      truncation="truncate_left",  # or "drop": a longer input is not scored (NaN)
      add_bos=True,
      weights=ml_collections.ConfigDict(helpsteer2_weights()),
      # A generative judge as the source instead of an attribute model: "genrm" (pairwise
      # \boxed{} scores and ranking) or "principle" (Final Judgement: Yes / No); its
      # source is a causal LM (an HF directory or a run) or a server's base URL.
      judge="",
      judge_max_new_tokens=512,  # a judge's answer, in tokens
      aggregation="mean_score",  # a GenRM's judgements in a group -> rewards ("win_count")
      judge_guidelines=True,  # genrm: the full prompt (False: the short one, for small models)
      judge_model="",  # a served judge's model name ("" = the one the server lists first)
      principle="",              # a principle RM's principle where a row names none
      # principle_verifier (rl:principle): the training reward when a verdict token is not
      # in the top 20 or the answer has no judgement (NeMo-RL's)
      penalty=-50.0,
      # The attribute model (source) and a principle judge as one reward: the judge's
      # reward times principle_coef added to the helpfulness column; its causal LM (an
      # HF directory or a run) or a server's base URL ("" = no judge)
      principle_source="", principle_coef=1.0))
  for key, value in overrides.items():
    section[key] = value
  return section


# Keys the scoring tasks had before `config.scorer`, and the scorer's model's old name key
# (main.py names the new one).
SCORING_RENAMED = {
    "init.checkpoint": "scorer.source", "init.hf_path": "scorer.source",
    "init.source": "scorer.source", "init.head": "scorer.head", "model": "scorer.model",
    "model.hf_path": "scorer.source", "model.preset": "scorer.model.name",
    "scorer.model.preset": "scorer.model.name",
    "tokenizer": "scorer.tokenizer", "score.batch_size": "scorer.batch_size",
    "score.max_len": "scorer.max_len",
    "score.pad_multiple": "removed: scoring pads to fixed length buckets (scorer.max_len)",
    "scorer.factory": "scorer.source", "scorer.checkpoint": "scorer.source",
    "scorer.batch": "scorer.batch_size", "data.truncation": "scorer.truncation",
    "data.add_bos": "scorer.add_bos",
}



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
