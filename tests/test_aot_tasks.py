"""Compile-only train steps of the attribute-model, 2D-DPO and RL tasks.

`abstract_train_step` must build the very step `Trainer` runs: the test
lowers and compiles it on the CPU mesh for every loss / reference mode
(test_batch_schemas checks its batch against the featurizer and pipeline);
one TPU compile (v5e:2x2) covers the on-the-fly reference, whose
step takes the frozen parameters as an extra argument.
"""

import math

import jax
import pytest
from flax import nnx

from helpsteer_jax import aot, runtime
from helpsteer_jax.tasks import attribute_model, dpo2d, iterative_dpo, rl, steerlm2

from train_utils import task_config

TINY = {"model.num_layers": 1, "train.seq_len": 64, "train.global_batch": 8,
        "train.micro_batch": 8, "train.loss_chunk_size": 32}


def tiny(task, **overrides):
  return task_config(task, {**TINY, **overrides})


CASES = {
    "regression": ("attribute_model", {}, {"inputs", "labels", "readout", "segment_ids",
                                            "positions"}),
    "regular_bt": ("attribute_model", {"loss": "regular_bt", "data.packing": False},
                   {"inputs", "segment_ids", "positions", "pair", "margin"}),
    "dpo2d_cached": ("dpo2d", {}, {"inputs", "targets", "positions", "segment_ids",
                                   "token_segments", "seg_scores", "seg_mask", "lengths",
                                   "pair_weight", "ref_logps"}),
    "dpo2d_on_the_fly": ("dpo2d", {"reference.mode": "on_the_fly"},
                         {"inputs", "targets", "positions", "segment_ids", "token_segments",
                          "seg_scores", "seg_mask", "lengths", "pair_weight"}),
    # LoRA: the reference is the policy with its adapters off (no frozen copy).
    "dpo2d_lora_on_the_fly": ("dpo2d", {"reference.mode": "on_the_fly", "model.lora.rank": 4,
                                        "model.lora.base_dtype": "bfloat16"},
                              {"inputs", "targets", "positions", "segment_ids",
                               "token_segments", "seg_scores", "seg_mask", "lengths",
                               "pair_weight"}),
    "regression_lora": ("attribute_model", {"model.lora.rank": 4},
                        {"inputs", "labels", "readout", "segment_ids", "positions"}),
    # RL: the policy update on rollout rows (the reference's log-probs ride in the batch).
    "rl_grpo": ("rl", {"rollout.max_new_tokens": 16},
                {"inputs", "targets", "positions", "segment_ids", "at", "mask", "advantages",
                 "old_logp", "ref_logp", "sampler_weight"}),
    # SteerLM 2.0: groups of n responses, their log Q' and importance weights.
    "steerlm2": ("steerlm2", {}, {"inputs", "targets", "positions", "segment_ids", "weights",
                                  "log_q", "ws", "group_weight"}),
    # Iterative DPO: each round is dpo2d's step on whole-response pairs.
    "iterative_dpo": ("iterative_dpo", {}, {"inputs", "targets", "positions", "segment_ids",
                                            "token_segments", "seg_scores", "seg_mask",
                                            "lengths", "pair_weight", "ref_logps"}),
}
TASK_MODULES = {"attribute_model": attribute_model, "dpo2d": dpo2d, "rl": rl,
                "steerlm2": steerlm2, "iterative_dpo": iterative_dpo}

def rows_per_example(task_name, config) -> int:
  """A pair's two rows, a SteerLM 2.0 group's n, else one."""
  if task_name == "steerlm2":
    return config.sampling.responses
  return 2 if task_name in ("dpo2d", "iterative_dpo") else 1


# One case per task kind joins the version tier (the rest are variants of a kind).
TIER_CASES = ("regression", "dpo2d_on_the_fly", "rl_grpo", "steerlm2", "iterative_dpo")


@pytest.mark.parametrize("case", [
    pytest.param(case, marks=pytest.mark.version_tier) if case in TIER_CASES else case
    for case in sorted(CASES)])
def test_abstract_step_compiles_on_the_cpu_mesh(case):
  task_name, overrides, keys = CASES[case]
  task = TASK_MODULES[task_name]
  config = tiny(task_name, **overrides)
  rt = runtime.setup(config)
  spec = task.abstract_train_step(config, rt)
  state, batch = spec.args[:2]
  assert set(batch) == keys
  seq = config.train.seq_len
  n = rows_per_example(task_name, config)
  rows = (1, 8, n, seq) if n > 1 else (1, 8, seq)
  assert batch["inputs"].shape == rows
  if task_name == "rl":
    assert batch["at"].shape == (1, 8, 16)
  # After the batch: the frozen base weights (LoRA), then a frozen reference copy (2D-DPO)
  # or what an RL iteration keeps resident (test_rl_step_counts_the_iteration_s_arrays).
  assert len(spec.args) == (4 if case in ("dpo2d_on_the_fly", "rl_grpo") else 3)
  base = spec.args[2]
  if "lora" in case:
    trained = ["/".join(str(k.key) for k in path) for path, _ in
               jax.tree_util.tree_leaves_with_path(state.params)]
    assert all("_lora/" in n or n.startswith("head/") for n in trained), trained
    assert any(n.startswith("head/") for n in trained) == (task_name == "attribute_model")
    dtypes = {str(x.dtype) for x in jax.tree.leaves(base)}
    assert dtypes == ({"bfloat16"} if "dpo2d" in case else {"float32"})
  else:
    assert base == {}
  compiled = spec.lower().compile()
  assert compiled.memory_analysis() is not None
  per_row = n * seq
  assert spec.tokens_per_step == config.train.global_batch * per_row
  assert spec.num_params > 0 and spec.analytic_flops_per_step > 0
  del state


@pytest.mark.parametrize("overrides, held", [
    ({"algorithm": "grpo"}, {"engine", "reference"}),
    ({"algorithm": "ppo", "scorer.source": ""}, {"engine", "reference", "attribute_model",
                                                  "critic"}),
    ({"algorithm": "rloo", "model.lora.rank": 4, "model.lora.base_dtype": "bfloat16",
      "scorer.source": "/runs/attribute_model"}, {"engine", "attribute_model"}),
    ({"algorithm": "dapo", "rollout.dtype": "bfloat16"}, {"engine"}),
    # A principle judge on the mesh is a causal LM (no attribute model), with its own
    # engine when it reasons; beside the attribute model when combined with it.
    ({"algorithm": "dapo", "scorer.judge": "principle", "scorer.source": "/runs/judge",
      "scorer.judge_max_new_tokens": 0}, {"engine", "judge"}),
    ({"algorithm": "dapo", "scorer.source": "/runs/attribute_model",
      "scorer.principle_source": "/runs/judge", "scorer.batch_size": 3,
      "scorer.max_len": 256}, {"engine", "attribute_model", "judge"}),
    ({"algorithm": "dapo", "scorer.source": "/runs/attribute_model",
      "scorer.principle_source": "http://judge:8000/v1"}, {"engine", "attribute_model"}),
    # a GenRM's verifier runs on the host: no attribute model, and no reference without KL
    ({"scorer.source": "genrm_verifier", "loss.beta": 0.0}, {"engine"}),
    # a GenRM judge on the mesh always decodes its answers: its engine too
    ({"algorithm": "dapo", "scorer.judge": "genrm", "scorer.source": "/runs/genrm",
      "scorer.batch_size": 3, "scorer.max_len": 256}, {"engine", "judge"}),
])
def test_rl_step_counts_the_iteration_s_arrays(overrides, held):
  """The RL step compiles with what an iteration keeps in device memory as unread
  arguments: XLA's argument bytes are the step's own plus exactly those arrays."""
  from helpsteer_jax.rl import resident, settings
  config = tiny("rl", **{"rollout.max_new_tokens": 16, "mesh.fsdp": 2, "mesh.tensor": 2,
                         "mesh.data": 2, **overrides})
  rt = runtime.setup(config)
  spec = rl.abstract_train_step(config, rt)
  arrays = spec.args[-1]
  assert set(arrays) == held
  engine = arrays["engine"]
  cache = engine["kv_cache"]
  assert len(cache) == 2 * config.model.num_layers
  rows = config.rollout.max_batch or settings.read(config).rows  # 0: all of an iteration
  assert cache[0].shape[:3] == (rows, config.model.num_kv_heads, config.train.seq_len)
  if "lora" in str(overrides):  # the engine decodes merged weights at the base's dtype
    assert {str(x.dtype) for x in jax.tree.leaves(engine["weights"])} == {"bfloat16"}
  if "rollout.dtype" in overrides:  # its own bf16 copy of every weight, a bf16 cache
    assert {str(x.dtype) for x in jax.tree.leaves(engine)} == {"bfloat16"}
    assert len(jax.tree.leaves(engine["weights"])) == len(jax.tree.leaves(spec.args[0].params))
  compiled = spec.lower().compile()
  own = resident.per_device_bytes(spec.args[:-1])
  got = compiled.memory_analysis().argument_size_in_bytes
  assert got == own + resident.per_device_bytes(arrays), (got, own)
  assert sum(spec.resident_bytes.values()) == resident.per_device_bytes(arrays)
  assert set(spec.resident_bytes) == {"engine_weights", "kv_cache"} | held - {"engine"}
  if "judge" in held:
    _check_judge(config, arrays["judge"])


def _check_judge(config, judge):
  """The judge's weights are a causal LM of `scorer.model`'s shapes (LM head included);
  when it reasons, its engine's per-layer copy of the layers and a KV cache of
  `scorer.batch_size` rows (rounded up to the batch shards) of `scorer.max_len` tokens."""
  from helpsteer_jax.models import builder
  cfg = runtime.build_model_config(config.scorer.model)
  want = nnx.state(nnx.eval_shape(lambda: builder.new_model(cfg)), nnx.Param)
  shapes = lambda tree: sorted(x.shape for x in jax.tree.leaves(tree))  # noqa: E731
  assert shapes(judge["weights"]) == shapes(want)
  assert any(x.shape[-1] == cfg.vocab_size for x in jax.tree.leaves(judge["weights"]["lm_head"]))
  if config.scorer.judge_max_new_tokens == 0:
    assert set(judge) == {"weights"}
    return
  assert shapes(judge["engine_layers"]) == shapes(want["layers"])
  cache = judge["kv_cache"]
  assert len(cache) == 2 * cfg.num_layers
  assert cache[0].shape == (4, cfg.num_kv_heads, config.scorer.max_len, cfg.head_dim)


def test_off_policy_rl_step_runs_on_the_training_devices_and_counts_the_rollout_side():
  """`rollout.max_staleness=1`: the step compiles on the training half of the devices
  (`config.mesh`) with the reference beside it; the engine and the policy's copy are on
  the rollout half (`rollout.mesh`), reported apart with their sharding there."""
  from helpsteer_jax.rl import resident
  config = tiny("rl", **{"rollout.max_new_tokens": 16, "mesh.fsdp": 2, "mesh.tensor": 2,
                         "mesh.data": 1, "rollout.max_staleness": 1, "rollout.mesh.data": 1,
                         "rollout.mesh.tensor": 2, "rollout.mesh.fsdp": 2,
                         "algorithm": "grpo"})
  spec = rl.abstract_train_step(config, rl.compile_runtime(config, jax.devices()))
  assert spec.rt.mesh.size == 4 and set(spec.args[-1]) == {"reference"}
  assert {d.id for d in spec.rt.mesh.devices.flat} == {0, 1, 2, 3}
  compiled = spec.lower().compile()
  assert compiled.memory_analysis().argument_size_in_bytes == (
      resident.per_device_bytes(spec.args[:-1]) + resident.per_device_bytes(spec.args[-1]))
  side = dict(spec.rollout_bytes)
  assert side.pop("devices") == 4 and set(side) == {"engine_weights", "kv_cache", "policy_copy"}
  # The same specs on a mesh of the same shape: the copy's shard is the policy's.
  assert side["policy_copy"] == resident.per_device_bytes(spec.args[0].params)
  assert 0 < side["engine_weights"] < side["policy_copy"]  # the layers only
  from helpsteer_jax.inference import engine_steps
  rt = spec.rt
  rollout_mesh = rl.off_policy.rollout_runtime(config, rt, jax.devices()[4:]).mesh
  cfg = config.model
  shape = (config.rollout.prompts_per_iteration * config.rollout.samples_per_prompt,
           cfg.num_kv_heads, config.train.seq_len, cfg.hidden_size // cfg.num_heads)
  shard = engine_steps.cache_sharding(rollout_mesh, rt.rules).shard_shape(shape)
  assert side["kv_cache"] == 2 * cfg.num_layers * math.prod(shard) * 4


@pytest.mark.version_tier  # libtpu's compiler and its JAX
def test_dpo2d_on_the_fly_compiles_for_v5e(tmp_path):
  config = tiny("dpo2d", **{"reference.mode": "on_the_fly"})
  topology = aot.parse_topology("v5e:2x2")
  devices = aot.compile_only_devices(topology, tmp_path / "tpu_logs")
  report = aot.analyze(config, topology, devices, flops=False)
  mem = report["memory"]
  assert report["task"] == "dpo2d" and report["chips"] == 4 and mem["fits"]
  # Policy params + two Adam moments (fp32, sharded 4 ways) + the frozen reference copy.
  assert mem["arguments"] >= 4 * 4 * report["params"] / 4
  assert jax.devices()[0].platform == "cpu"


def test_cost_analysis_counts_the_remat_forward():
  """Full remat runs each layer's forward again in the backward pass; the unrolled
  compile that `aot.unrolled_cost_per_step` analyses must keep that recompute (a CSE
  barrier), or its FLOPs would be those of a step without remat."""
  from helpsteer_jax import unrollable
  from helpsteer_jax.tasks import acsft

  def flops(remat):
    config = task_config("acsft", {"model.num_layers": 2, "train.seq_len": 64,
                                   "train.global_batch": 8, "train.micro_batch": 8,
                                   "train.loss_chunk_size": 32, "model.remat_policy": remat})
    with unrollable.unrolled_for_analysis():
      spec = acsft.abstract_train_step(config, runtime.setup(config, jax.devices()))
      lowered = spec.lower()
      # XLA:TPU merges an unbarriered recompute into the first forward (XLA:CPU
      # does not), so the barrier itself is what this checks: one per layer.
      barriers = lowered.as_text().count("optimization_barrier")
      return aot.compiled_cost(lowered.compile())["flops"], barriers

  (none, none_barriers), (full, full_barriers) = flops("none"), flops("full")
  assert (none_barriers, full_barriers) == (0, 2)
  # The layers' forward is about a third of their training FLOPs.
  assert full > 1.15 * none, (none, full)
