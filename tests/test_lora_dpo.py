"""2D-DPO / DPO with LoRA: the reference is the policy with its adapters off.

References: the base model itself (adapters off give its log-probs bit for
bit), DPO's definition (policy = reference at the start: every pair's loss
is log 2, every margin 0) and the cached-reference mode (the same losses).
"""

import json
import math

import jax
import numpy as np
import pytest
from flax import nnx
from test_dpo2d_task import _config, _first_step

from helpsteer_jax import runtime
from helpsteer_jax.data.demo import pairs_2d
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.losses.pair_logprobs import model_segment_logps
from helpsteer_jax.models import builder, hf, lora
from helpsteer_jax.runs import preference
from helpsteer_jax.tasks import dpo2d as task


def _metrics(workdir):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r for r in rows if "loss" in r}


def _lora(config, mode):
  config.model.lora.update(rank=4, alpha=8.0)
  config.reference.mode = mode
  config.train.update(num_steps=3, save_every=100)
  config.optimizer.update(lr=1e-2)
  return config


def test_adapters_off_log_probs_are_the_base_models_exactly(tmp_path):
  config = _config(loss_type="dpo")
  rt = runtime.setup(config)
  model = runtime.build_model(config, rt)
  adapted = builder.with_adapters(model, lora.LoraConfig(rank=4, alpha=8.0), rt.mesh, rt.rules)
  graphdef, adapters, rest = nnx.split(adapted, nnx.LoRAParam, ...)
  adapters = jax.tree.map(lambda x: x + 0.3, nnx.to_pure_dict(adapters))  # trained, B != 0
  adapted = nnx.merge(graphdef, adapters, rest)
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path / "tok"))
  demo = pairs_2d.write_demo_2d(tmp_path / "demo", 8, 0)
  features = preference.load_features(str(demo / "train.jsonl"), config,
                                preference.loss_config(config, csv=False), tok)[:4]
  batch = {k: np.stack([f[k] for f in features]) for k in
           ("inputs", "targets", "positions", "segment_ids", "token_segments", "seg_mask")}
  base = np.asarray(model_segment_logps(model, batch, 64))
  with lora.disabled():
    off = np.asarray(model_segment_logps(adapted, batch, 64))
  on = np.asarray(model_segment_logps(adapted, batch, 64))
  np.testing.assert_array_equal(off, base)
  assert np.abs(on - base).max() > 1e-3


def test_on_the_fly_lora_reference_needs_no_copy_and_matches_the_cached_mode(tmp_path):
  on_the_fly = _lora(_config(loss_type="dpo"), "on_the_fly")
  assert preference.adapters_off_reference(on_the_fly)
  summary = task.run(on_the_fly, str(tmp_path / "fly"))
  first = _first_step(tmp_path / "fly")
  assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)  # policy == reference
  assert first["reward_margin"] == 0.0
  assert not (tmp_path / "fly" / "reference").exists()
  assert summary["status"] == "finished"

  cached = _lora(_config(loss_type="dpo"), "cached")
  task.run(cached, str(tmp_path / "cached"))
  a, b = _metrics(tmp_path / "fly"), _metrics(tmp_path / "cached")
  for step in (1, 2, 3):
    assert a[step]["loss"] == pytest.approx(b[step]["loss"], rel=1e-5, abs=1e-6), step
  assert a[3]["loss"] != a[1]["loss"]  # it trained
