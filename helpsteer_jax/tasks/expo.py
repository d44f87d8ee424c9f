"""ExPO (Zheng et al. 2024): a trained model extrapolated away from where it started.

theta = theta_1 + alpha (theta_1 - theta_0), with theta_0 = `expo.base` (the
starting checkpoint: the SFT model, or the model a reward model was trained
from) and theta_1 = `expo.tuned`, for each alpha of `expo.alpha` (one float
or a comma list). Both are any training task's Orbax run or an HF directory
(`expo_sources`); a reward model's head is extrapolated with its backbone.
Both are read by the existing loaders in fp32 on the mesh, combined by one
jitted function over the sharded trees (fp32, cast back to theta_1's saved
dtype per parameter; alpha = 0 returns theta_1 bit for bit) and written per
alpha to `<workdir>/alpha_<alpha>/`: `checkpoints/<step>` (the params-only
Orbax layout every `init.source` / `scorer.source` reads) and `hf/` (the
causal LM with theta_1's tokenizer, chat template and `steerlm` section, or
the *ForSequenceClassification directory) plus a reward model's `head.npz`.
Every process computes; process 0 writes the files, Orbax the checkpoints.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from helpsteer_jax import config_base, processes, runtime, saved_params
from helpsteer_jax.data import chat_template
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.load import model as loader
from helpsteer_jax.load import reward as reward_model
from helpsteer_jax.models import hf, reward_hf
from helpsteer_jax.runs import expo_sources
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.runs.expo_sources import REWARD, Source
from helpsteer_jax.scoring import load as scoring_load

# What a source's HF export carries beyond the weights writer's own files (the SteerLM
# training export adds them): config.json's steerlm section, the turn marker as an EOS id.
EXPORT_EXTRAS = (("config.json", chat_template.SECTION),
                 ("generation_config.json", "eos_token_id"))


HF_DTYPES = ("", "bfloat16", "float16", "float32")


def parse_alphas(value: Any) -> list[float]:
  """`expo.alpha` ("0.3", "0.1,0.3,0.5" or a number) as distinct floats >= 0."""
  parts = [p.strip() for p in str(value).split(",") if p.strip()]
  try:
    alphas = [float(p) for p in parts]
  except ValueError:
    raise ConfigError(f"expo.alpha={value!r}: give a number or a comma list of numbers,"
                      " e.g. 0.3 or 0.1,0.3,0.5") from None
  if not alphas or any(not np.isfinite(a) or a < 0 for a in alphas):
    raise ConfigError(f"expo.alpha={value!r}: every alpha must be a finite number >= 0"
                      " (0 reproduces expo.tuned; ExPO uses about 0.1-0.5)")
  if len(set(map(alpha_label, alphas))) != len(alphas):
    raise ConfigError(f"expo.alpha={value!r} names an alpha twice")
  return alphas


def alpha_label(alpha: float) -> str:
  return f"{alpha:g}"


def extrapolator(dtypes: dict, shardings: dict) -> Callable[[dict, dict, jax.Array], dict]:
  """`fn(base, tuned, alpha)`: tuned + alpha (tuned - base) per leaf in fp32, cast to
  `dtypes` (a tree like the params); alpha = 0 gives `tuned` cast, bit for bit. One
  program for every alpha; outputs laid out as `shardings`."""

  def fn(base: dict, tuned: dict, alpha: jax.Array) -> dict:
    def one(b: jax.Array, t: jax.Array, dtype: np.dtype) -> jax.Array:
      t32 = t.astype(jnp.float32)
      out = (t32 + alpha * (t32 - b.astype(jnp.float32))).astype(dtype)
      return jnp.where(alpha == 0, t.astype(dtype), out)  # -0.0 + 0 would give +0.0
    return jax.tree.map(one, base, tuned, dtypes)

  return jax.jit(fn, out_shardings=shardings)


def _model_section(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  section = config.model.copy_and_resolve_references()
  section.param_dtype = "float32"  # the arithmetic's; written back in the saved dtypes
  return section


def load_source(source: Source, config: ml_collections.ConfigDict,
                rt: runtime.Runtime) -> nnx.Module:
  """The model at `source` on the mesh in fp32, through the loaders every task uses."""
  model = _model_section(config)
  if source.kind == REWARD:
    return scoring_load.load_reward_model(str(source.path), rt, model)
  return loader.load_model(ml_collections.ConfigDict(dict(
      model=model, init=config_base.init_section(source=str(source.path)), seed=config.seed)),
      rt, loader.DECODE)


def _params(model: nnx.Module) -> dict:
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _dtype_tree(params: dict, dtypes: dict[str, str]) -> dict:
  def pick(path, _):
    return np.dtype(jnp.dtype(dtypes[expo_sources.param_name(path)]))
  return jax.tree_util.tree_map_with_path(pick, params)


def _with_params(model: nnx.Module, params: dict) -> nnx.Module:
  graphdef, state = nnx.split(model)
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)


def _carry_export_extras(src: pathlib.Path | None, out: pathlib.Path) -> None:
  """Copies EXPORT_EXTRAS from the source's HF export into the written one (process 0)."""
  if src is None or not processes.is_primary():
    return
  for name, key in EXPORT_EXTRAS:
    source_file, target_file = src / name, out / name
    if not (source_file.is_file() and target_file.is_file()):
      continue
    value = json.loads(source_file.read_text()).get(key)
    if value is not None:
      content = json.loads(target_file.read_text())
      content[key] = value
      target_file.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")


def _check(config: ml_collections.ConfigDict, workdir: pathlib.Path
           ) -> tuple[list[float], Source, Source, str]:
  """Every setting checked from metadata: (alphas, base, tuned, tokenizer directory)."""
  alphas = parse_alphas(config.expo.alpha)
  base = expo_sources.inspect(config.expo.base, "expo.base")
  tuned = expo_sources.inspect(config.expo.tuned, "expo.tuned")
  expo_sources.check_compatible(base, tuned)
  expo_sources.check_model_name((base, tuned), runtime.build_model_config(config.model),
                                config.model.name)
  if config.expo.hf_dtype not in HF_DTYPES:
    raise ConfigError(f"expo.hf_dtype={config.expo.hf_dtype!r}; choose one of"
                      f" {', '.join(map(repr, HF_DTYPES))} ('' = expo.tuned's own)")
  if config.expo.export_hf and tuned.head_bias:
    raise ConfigError(f"expo.tuned={tuned.path}: {reward_hf.BIAS_REFUSED}; here:"
                      " --config.expo.export_hf=False")
  tokenizer = config.tokenizer or str(tuned.tokenizer_dir or "")
  if config.expo.export_hf and not tokenizer:
    raise ConfigError(f"expo.tuned={tuned.path} has no tokenizer files (no HF export, no"
                      " demo tokenizer): set --config.tokenizer for the HF output")
  for alpha in alphas:
    out = workdir / f"alpha_{alpha_label(alpha)}" / saved_params.CHECKPOINTS
    if out.exists() and any(out.iterdir()):
      raise ConfigError(f"{out} already holds a checkpoint: choose another --workdir or"
                        " remove it")
  return alphas, base, tuned, tokenizer


def _write(out: pathlib.Path, model: nnx.Module, params: dict, tuned: Source, step: int,
           config: ml_collections.ConfigDict, hf_dtype: str, tokenizer: str) -> dict:
  """One alpha's outputs; returns what was written."""
  written = {"dir": str(out), "checkpoint": str(saved_params.save_params(out, params, step))}
  if tuned.kind == REWARD and processes.is_primary():
    reward_model.save_head(out / reward_model.HEAD_FILE, params["head"])
    written["head"] = str(out / reward_model.HEAD_FILE)
  if config.expo.export_hf:
    hf_dir = out / saved_params.HF_EXPORT
    if tuned.kind == REWARD:
      reward_hf.save_reward_hf(model, hf_dir, dtype=hf_dtype, tokenizer=tokenizer)
    else:
      hf.save_hf_model(model, hf_dir, dtype=hf_dtype, tokenizer=tokenizer)
      _carry_export_extras(tuned.export_dir, hf_dir)
    written["hf"] = str(hf_dir)
  return written


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  alphas, base, tuned, tokenizer = _check(config, pathlib.Path(workdir))
  setup = setup_lib.prepare(config, workdir, tokenizer=False, model=False)
  hf_dtype = config.expo.hf_dtype or tuned.hf_dtype
  theta0 = _params(load_source(base, config, setup.rt))
  model = load_source(tuned, config, setup.rt)
  theta1 = _params(model)
  shardings = jax.tree.map(lambda x: x.sharding, theta1)
  step = tuned.step or 0
  apply = extrapolator(_dtype_tree(theta1, tuned.dtypes), shardings)
  outputs = {}
  for alpha in alphas:
    params = apply(theta0, theta1, jnp.float32(alpha))
    out = setup.workdir / f"alpha_{alpha_label(alpha)}"
    outputs[alpha_label(alpha)] = _write(out, _with_params(model, params), params, tuned, step,
                                         config, hf_dtype, tokenizer)
    logging.info("ExPO alpha=%g written to %s", alpha, out)
    del params
  summary = {"kind": tuned.kind, "base": str(base.path), "tuned": str(tuned.path),
             "hf_dtype": hf_dtype if config.expo.export_hf else None, "outputs": outputs}
  summary_lib.write_summary(
      setup.workdir / "expo.json", summary,
      f"expo: {tuned.kind} extrapolated at alpha {', '.join(map(alpha_label, alphas))}"
      f" (each: checkpoints/{', hf/' if config.expo.export_hf else ''}"
      f"{', head.npz' if tuned.kind == REWARD else ''})",
      outputs={f"alpha {alpha_label(a)}": setup.workdir / f"alpha_{alpha_label(a)}"
               for a in alphas})
  return summary

