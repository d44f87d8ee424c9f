"""The steerlm2 task end to end on a tiny policy: two iterations in one run write
NeMo-Aligner's SteerLM 2.0 files, each iteration samples from the last one's weights,
log Q' is the training path's own (the first step's baseline is uniform), a run
stopped after an iteration or inside a sampling file resumes to the same files, the
adherence report compares every model, and bad settings fail before anything loads.

The attribute model is a user's factory scorer (`fake_scorer.make`: verbosity is the
response's words / 4), so adherence has something a random policy can follow.
"""

import json

import numpy as np
import pytest

from helpsteer_jax.data.formats import steerlm2 as fmt
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.tasks import steerlm2 as task

from train_utils import task_config_overrides, tiny_policy_config

N = 3


def _config(**overrides):
  config = tiny_policy_config("steerlm2")
  config.scorer.source = "fake_scorer:make"
  config.unconditional.with_label = False  # the unlabelled pass (the demo skips it)
  config.steer_attributes = "helpfulness,verbosity"
  config.prompts.update(demo_rows=12, per_iteration=4)
  config.sampling.update(responses=N, max_new_tokens=12, batch_prompts=2)
  config.eval.update(requests=4, prompts=2, scores="1,3", max_new_tokens=8, batch_size=8)
  config.train.update(num_steps=2, global_batch=4, micro_batch=4, seq_len=96, log_every=1,
                      save_every=1, export_hf=False, loss_chunk_size=32, async_checkpoint=False)
  config.optimizer.update(lr=1e-2)
  return task_config_overrides(config, overrides)


def _metrics(path):
  return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_two_iterations_write_nemo_files_and_resume_to_the_same_ones(tmp_path):
  full = tmp_path / "full"
  summary = task.run(_config(), str(full))
  assert summary["status"] == "finished"
  assert set(summary["adherence"]) == {"AC-SFT", "iteration 1", "iteration 2"}
  assert set(summary["adherence"]["AC-SFT"]) == {"helpfulness", "verbosity", "mean"}
  assert "| iteration 2 |" in summary["table"] and "| iteration 2 |" in summary["sweep_table"]
  assert (full / "adherence.png").stat().st_size > 0

  for r in (1, 2):
    groups = fmt.read_groups(full / f"iteration_{r}" / "samples.jsonl")
    assert len(groups) == 4 and all(len(g.responses) == N for g in groups)
    g = groups[0]
    assert g.label.startswith("helpfulness:") and ",verbosity:" in g.label
    assert all(x.log_q < 0 and x.log_p_unconditional < 0 and x.log_p_attributes <= 0
               for x in g.responses)
    # log Q' is the training path's: the first step's baseline is uniform.
    first = next(m for m in _metrics(full / f"iteration_{r}") if m.get("step") == 1)
    np.testing.assert_allclose(first["base_weight_max"], 1 / N, rtol=1e-4)
  one = fmt.read_groups(full / "iteration_1" / "samples.jsonl")
  two = fmt.read_groups(full / "iteration_2" / "samples.jsonl")
  # Iteration 2 samples from iteration 1's result, not from the start.
  assert [x.text for x in one[0].responses] != [x.text for x in two[0].responses] or \
      one[0].responses[0].log_q != two[0].responses[0].log_q

  # A run of one iteration, then the same run asked for two: the second skips iteration 1.
  resumed = tmp_path / "resumed"
  task.run(_config(iterations=1), str(resumed))
  # A sampling file cut after its first batch (a kill) is completed to the same rows.
  cut = resumed / "iteration_2"
  cut.mkdir()
  lines = (full / "iteration_2" / "samples.jsonl").read_text().splitlines(keepends=True)
  (cut / "samples.jsonl").write_text("".join(lines[:2]))
  task.run(_config(), str(resumed))
  for r in (1, 2):
    a = (full / f"iteration_{r}" / "samples.jsonl").read_text()
    b = (resumed / f"iteration_{r}" / "samples.jsonl").read_text()
    assert a == b, r
  assert json.loads((resumed / "summary.json").read_text())["adherence"] == summary["adherence"]


@pytest.mark.parametrize("key, value, match", [
    ("sampling.responses", 1, "at least 2"),
    ("loss.attribute_sigma", 0.0, "attribute_sigma"),
    ("prompts.attributes", "given", "labels or run"),
    ("iterations", 0, "at least 1"),
    ("train.export_best", "loss", "a round trains without evaluation data"),
])
def test_bad_settings_fail_before_loading(tmp_path, key, value, match):
  with pytest.raises(ConfigError, match=match):
    task.run(_config(**{key: value}), str(tmp_path))


def test_lora_is_refused(tmp_path):
  config = _config()
  config.model.lora.rank = 4
  with pytest.raises(ConfigError, match="lora.rank=0"):
    task.run(config, str(tmp_path))
