"""RLBFF's principle judge trained by RL (`rl:principle`): HelpSteer3 principle rows
written here in the card's schema become judge prompts with their truth as the reference
(bad rows named by file and line), the rollout's own verdict log-probs reach the
`principle_verifier` reward through the answered conversation, and a short GRPO run on
a tiny random policy goes end to end."""

import gzip
import json
import math

import numpy as np
import pytest

from helpsteer_jax.data.records import ANSWER_KEY, ATTRIBUTES
from helpsteer_jax.errors import ConfigError, DataError
from helpsteer_jax.inference import sample_score
from helpsteer_jax.inference.row_stream import Output, TokenLogprobs
from helpsteer_jax.judges import principle
from helpsteer_jax.runs import prompts as prompts_lib
from helpsteer_jax.scoring.principle_verifier import PrincipleVerifier
from helpsteer_jax.scoring.scorer import REWARD_SLOT, HostScorer
from helpsteer_jax.tasks import rl as task

from train_utils import task_config, task_config_overrides

SLOT = ATTRIBUTES.index(REWARD_SLOT)
CONTEXTS = [[{"role": "user", "content": "Write a haiku about rain."}],
            [{"role": "user", "content": "Write a haiku about rain."},
             {"role": "assistant", "content": "Rain taps the window."},
             {"role": "user", "content": "Now one about snow."}]]


def write_rows(path, n=8):
  rows = [{"domain": "general", "language": "english", "context": CONTEXTS[i % 2],
           "response": f"Snow falls {i} times.", "principle": "The response is a haiku.",
           "fulfilment": "Yes" if i % 3 else "No"} for i in range(n)]
  path.parent.mkdir(parents=True, exist_ok=True)
  with gzip.open(path, "wt") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return rows


def _config(data_dir, **overrides):
  config = task_config("rl", preset="principle")
  config.model.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=2, attention_block_size=32, initializer_range=0.5)
  config.init.source = ""
  config.mesh.update(data=2, fsdp=2, tensor=2)
  config.prompts.update(train_path=str(data_dir), eval_limit=2)
  config.rollout.update(prompts_per_iteration=2, samples_per_prompt=4, max_new_tokens=8)
  config.train.update(num_steps=2, global_batch=8, micro_batch=8, seq_len=512, eval_every=2,
                      save_every=2, export_hf=False, loss_chunk_size=64,
                      async_checkpoint=False)
  return task_config_overrides(config, overrides)


def test_principle_rows_become_judge_prompts_and_bad_rows_are_named(tmp_path):
  rows = write_rows(tmp_path / "hs3" / "principle" / "train.jsonl.gz")
  config = _config(tmp_path / "hs3")
  requests = prompts_lib.read_requests("", "train", {"helpfulness": 4}, config)
  assert len(requests) == len(rows)
  r = requests[1]
  assert r.attributes == {} and r.extra["domain"] == "general"
  assert r.extra["reference"]["fulfilment"] == "Yes"
  assert "User: Now one about snow." in r.prompt and r.prompt.endswith("it does not.")
  assert r.answered("x").reference["principle"] == "The response is a haiku."
  # eval prompts: no eval_path, so the same directory's validation split
  with pytest.raises(ConfigError, match="validation"):
    prompts_lib.read_requests("", "eval", {}, config)
  bad = tmp_path / "bad" / "principle.jsonl"
  bad.parent.mkdir()
  bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], "fulfilment": "Maybe"})
                 + "\n")
  config.prompts.train_path = str(bad)
  with pytest.raises(DataError, match=r"principle.jsonl.*2.*fulfilment"):
    prompts_lib.read_requests("", "train", {}, config)
  config.prompts.train_path = ""
  with pytest.raises(ConfigError, match="train_path"):
    prompts_lib.read_requests("", "train", {}, config)


class _CharTokenizer:
  """One token per character (ids = code points): a tokenizer for hand-made outputs."""

  def __call__(self, text, add_special_tokens=False):
    return {"input_ids": [ord(c) for c in text]}

  def decode(self, ids, skip_special_tokens=False):
    return "".join(chr(i) for i in ids)


def _output(text, present):
  """An engine output writing `text`, whose top-20 at every token holds `present`."""
  ids = [ord(c) for c in text]
  top_ids = np.tile(np.arange(1000, 1020), (len(ids), 1))
  top = np.tile(np.linspace(-9, -12, 20), (len(ids), 1)).astype(np.float32)
  for j, (token, value) in enumerate(present.items()):
    top_ids[:, j], top[:, j] = token, value
  raw = TokenLogprobs(np.zeros(len(ids), np.float32), top_ids, top)
  return Output(ids, [0.0] * len(ids), text, "stop", raw)


def test_the_verifier_reads_each_rollouts_verdict(tmp_path):
  """Through the sampling path: a request with a reference carries its output to the
  scorer; the reward is the signed difference at the verdict token (" " is the shared
  prefix of the one-character tokens, "Y" / "N" the verdicts), or the penalty."""
  write_rows(tmp_path / "hs3" / "principle" / "train.jsonl.gz", n=3)
  requests = prompts_lib.read_requests("", "train", {}, _config(tmp_path / "hs3"))
  truths = [r.extra["reference"]["fulfilment"] for r in requests]
  assert truths == ["No", "Yes", "Yes"]
  y, n = ord("Y"), ord("N")
  outputs = [_output("It is. Final Judgement: No", {n: -0.25, y: -1.75}),
             _output("Final Judgement: Yes", {y: -0.5, n: -2.0}),
             _output("Final Judgement: Yes", {y: -0.01}),   # " No" not in the top 20
             _output("It is a haiku.", {y: -0.5, n: -0.6}),  # no judgement
             ]
  responses = [o.text for o in outputs]
  reqs = [requests[0], requests[1], requests[2], requests[1]]
  scorer = HostScorer(PrincipleVerifier(_CharTokenizer()))
  preds = sample_score.score(responses, reqs, 1, scorer, outputs)
  expected = [-0.25 - -1.75, -0.5 - -2.0, principle.PENALTY, principle.PENALTY]
  np.testing.assert_allclose(preds[:, SLOT], expected, atol=1e-5)
  assert np.all(np.delete(preds, SLOT, axis=1) == 0)
  conv = reqs[0].answered(responses[0], outputs[0])
  assert conv.reference[ANSWER_KEY] is outputs[0]
  assert ANSWER_KEY not in requests[0].extra["reference"]
  with pytest.raises(ConfigError, match="max_staleness=0"):
    sample_score.score(responses, reqs, 1, scorer)  # no outputs: not a rollout


def test_rl_principle_runs_end_to_end(tmp_path):
  data = tmp_path / "hs3"
  write_rows(data / "principle" / "train.jsonl.gz")
  write_rows(data / "principle" / "validation.jsonl.gz", n=2)
  summary = task.run(_config(data), str(tmp_path / "run"))
  assert summary["status"] == "finished" and summary["iteration"] == 2
  rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
          .splitlines()]
  train = [r for r in rows if "reward" in r]
  assert len(train) == 2 and all(math.isfinite(r["reward"]) for r in train)
  # A random policy writes no judgement: every completion gets the penalty.
  assert all(r["reward"] == principle.PENALTY for r in train)
  samples = (tmp_path / "run" / "samples" / "iteration_000002.jsonl").read_text().splitlines()
  assert len(samples) == 2 and json.loads(samples[0])["reward"] == principle.PENALTY
  # A judge's measures: no answer has a verdict; no steering distance.
  assert [r["parse_failures"] for r in train] == [1.0, 1.0]
  assert summary["eval_parse_failures_before"] == summary["eval_parse_failures_after"] == 1.0
  assert summary["eval_reward_after"] == principle.PENALTY
  assert not any("steer" in k for r in rows for k in r) and not any("steer" in k
                                                                     for k in summary)


def test_the_verifier_needs_on_policy_single_turn_rollouts(tmp_path):
  write_rows(tmp_path / "hs3" / "principle" / "train.jsonl.gz")
  config = _config(tmp_path / "hs3", **{"rollout.multi_turn": True})
  with pytest.raises(ConfigError, match="multi_turn=false"):
    task.run(config, str(tmp_path / "run"))


def test_a_compile_only_run_holds_no_attribute_model_for_the_verifier():
  from helpsteer_jax.rl import resident
  assert not resident.scorer_on_mesh("principle_verifier")
  assert resident.scorer_on_mesh("workdir/attribute_model")
