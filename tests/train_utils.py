"""Small trainer setups for the training-engine tests."""

import functools
import runpy

import numpy as np

from helpsteer_jax import config_base, config_sections, runtime
from helpsteer_jax.config_sections import optimizer_config
from helpsteer_jax.data.features.next_token import next_token_features
from helpsteer_jax.losses.sft import sft_loss
from helpsteer_jax.train import loop
from helpsteer_jax.train import state as state_lib

from conftest import REPO_ROOT


def task_config(task: str, overrides: dict | None = None, preset: str = ""):
  """configs/<task>.py's config with dotted-key overrides ({"data.packing": False})."""
  config = runpy.run_path(str(REPO_ROOT / "configs" / f"{task}.py"))["get_config"](preset)
  return task_config_overrides(config, overrides)


def tiny_policy_config(task: str, overrides: dict | None = None):
  """An aligning task's demo config (rl, steerlm2, iterative_dpo) on a random one-layer
  policy (no AC-SFT run) over the 2x2x2 mesh, with dotted-key overrides."""
  config = task_config(task)
  config.model.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=2, attention_block_size=32, initializer_range=0.5)
  config.init.source = ""
  config.mesh.update(data=2, fsdp=2, tensor=2)
  return task_config_overrides(config, overrides)


def task_config_overrides(config, overrides: dict | None):
  """`config` with dotted-key overrides."""
  for key, value in (overrides or {}).items():
    *path, leaf = key.split(".")
    target = config
    for part in path:
      target = target[part]
    target[leaf] = value
  return config


def tiny_config(mesh=(2, 2, 2), **train):
  config = config_base.base_config("unit")
  config.model = config_base.model_section("tiny", attention_block_size=32)
  config.data = config_base.data_config()
  config.mesh = config_base.mesh_config(*mesh)
  defaults = dict(num_steps=6, global_batch=8, micro_batch=4, seq_len=64, log_every=1,
                  eval_every=0, save_every=2, keep_checkpoints=5, export_hf=False,
                  loss_chunk_size=32, async_checkpoint=True)
  config.train = config_sections.train_config(**{**defaults, **train})
  config.optimizer = optimizer_config(lr=3e-3, min_lr=3e-4, warmup_steps=2)
  return config


def lora_config(rank=8, **train):
  """`tiny_config` with LoRA adapters of `rank` (alpha 2 * rank)."""
  config = tiny_config(**train)
  config.model.lora.update(rank=rank, alpha=2.0 * rank)
  return config


def synthetic_features(n=64, seed=0, vocab=1024, repeat_of=None):
  """Random token sequences; the second half of each carries loss."""
  rng = np.random.RandomState(seed)
  out = []
  for i in range(n):
    if repeat_of is not None:
      rng = np.random.RandomState(i % repeat_of)
    length = rng.randint(12, 60)
    ids = rng.randint(3, vocab, length)
    mask = np.zeros(length, bool)
    mask[length // 2:] = True
    out.append(next_token_features(ids, mask))
  return out


def make_trainer(config, workdir, features, eval_features=()):
  rt = runtime.setup(config)
  model = runtime.build_model(config, rt)
  parts = state_lib.split_model(model, rt.mesh, rt.rules)
  loss = functools.partial(sft_loss, chunk_size=config.train.loss_chunk_size)
  flops = runtime.model_config(config).flops_per_token(config.train.seq_len)
  return loop.Trainer(config, workdir, rt, parts, loss, features, eval_features,
                      flops_per_token=flops)


def read_metrics(workdir):
  import json
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r for r in rows if "loss" in r}


def full_and_resumed(make_config, features, root, stop_at=3):
  """Metrics of an uninterrupted run and of one stopped at `stop_at` and resumed."""
  full = make_trainer(make_config(), root / "full", features)
  full.run()
  full.close()
  first = make_trainer(make_config(), root / "resumed", features)
  assert first.run(stop_at=stop_at).status == "stopped"
  first.close()
  second = make_trainer(make_config(), root / "resumed", features)
  assert int(second.state.step) == stop_at
  second.run()
  second.close()
  return read_metrics(root / "full"), read_metrics(root / "resumed")
