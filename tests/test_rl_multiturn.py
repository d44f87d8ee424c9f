"""Multi-turn rollouts (`rollout.multi_turn`, rl/multiturn.py): the policy answers every
user turn of a prompt in order; the rows the update reads are the contexts the answers
were sampled from, masked to the policy's own tokens; the reward scores the final answer
or each one."""

import json
import pathlib

import numpy as np
import pytest
from test_rl_resume import assert_resumes
from test_rl_task import _config, _train_rows

from helpsteer_jax.data import template
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.errors import DataError
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.engine import Output
from helpsteer_jax.inference.sampling import SamplingConfig, sample_seed
from helpsteer_jax.rl import multiturn, objective
from helpsteer_jax.rl.rollout import Prompt, longest_answer
from helpsteer_jax.scoring.scorer import HostScorer
from helpsteer_jax.tasks import rl as task

MT_BENCH = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench"


class CharTokenizer:
  """One id per character; EOS is id 0."""
  eos_token_id = 0

  def __call__(self, text, add_special_tokens=False):
    return {"input_ids": [ord(c) for c in text]}

  def decode(self, ids, skip_special_tokens=False):
    return "".join(chr(i) for i in ids if i)


class FakeEngine:
  """Answers "a<seed % 97>" then the turn end and the stop marker (seed % 3 == 0: cut at
  the token limit instead; seed % 5 == 0: ended by EOS); records every request."""

  def __init__(self, max_length=512):
    self.tokenizer, self.eos_ids, self.max_length, self.pad_id = CharTokenizer(), {0}, \
        max_length, 0
    self.requests = []

  def generate(self, requests):
    out = []
    for r in requests:
      self.requests.append(r)
      text = f"a{r.seed % 97}"
      if r.seed % 3 == 0:
        ids, finish, shown = [ord(c) for c in (text * 9)][:r.max_tokens], "length", None
      elif r.seed % 5 == 0:
        ids, finish, shown = [ord(c) for c in text] + [0], "stop", text
      else:
        full = text + template.END_OF_TURN + template.TURN_START
        ids, finish, shown = [ord(c) for c in full], "stop", text + template.END_OF_TURN
      ids = ids[:r.max_tokens]
      lp = list(-0.1 * (1 + np.arange(len(ids))))
      out.append(Output(ids, lp, shown if shown is not None else "".join(map(chr, ids)),
                        finish, None))
    return out


def _prompt(turns, attributes=None):
  request = steering.make_request(turns[0], attributes or {"helpfulness": 4})
  request.follow_ups = tuple(turns[1:])
  return Prompt(request, [ord(c) for c in request.prompt_text()])


def test_each_answer_continues_its_own_row_and_only_the_policy_tokens_are_masked():
  engine = FakeEngine()
  prompts = [_prompt(["first?", "second?", "third?"]), _prompt(["only one"])]
  k, width = 3, 300
  r = multiturn.sample(engine, prompts, k, 8, width, SamplingConfig(1.0), seed=7, step=2,
                       first=4)
  # Turn 1: single-turn's seeds; later turns: (seed, step, prompt, sample, turn).
  first = [q.seed for q in engine.requests[:2 * k]]
  assert first == [sample_seed(7, 2, 4 + i, j) for i in range(2) for j in range(k)]
  later = engine.requests[2 * k:]
  assert [q.seed for q in later] == [sample_seed(7, 2, 4, j, t) for t in (1, 2)
                                     for j in range(k)]
  for b in range(len(prompts) * k):
    p = prompts[b // k]
    row = r.tokens[b][r.mask[b] > 0].tolist()
    n = int(np.flatnonzero(r.mask[b])[-1]) + 1
    full = p.ids + r.tokens[b, :n].tolist()
    # Every later answer was sampled from exactly the row before it.
    asked = [q for q in later if q.seed in {sample_seed(7, 2, 4 + b // k, b % k, t)
                                            for t in (1, 2)}]
    for q in asked:
      assert full[:len(q.prompt_ids)] == list(q.prompt_ids)
    answers = r.answers[b]
    assert len(answers) == 1 + len(p.request.follow_ups)
    assert len(row) == int(r.mask[b].sum()) and np.all(r.sampler_logp[b][r.mask[b] == 0] == 0)
    # The row reads as the template writes the conversation, whatever ended each answer.
    conv = p.request.conversation
    label = template.label_string(p.request.attributes)
    turns = list(conv.turns)
    for j, answer in enumerate(answers[:-1]):
      turns += [Turn("Assistant", answer, label=label),
                Turn("User", p.request.follow_ups[j])]
    want = template.generation_prompt(Conversation(conv.system, tuple(turns)),
                                      p.request.attributes)
    text = engine.tokenizer.decode(full)
    assert text.startswith(want) and text[len(want):].startswith(answers[-1])
  assert r.tokens.shape == (6, width)
  assert np.all(r.finished[3:] == [sample_seed(7, 2, 5, j) % 3 != 0 for j in range(k)])


def test_a_prompt_without_follow_ups_rolls_out_as_single_turn():
  from helpsteer_jax.rl import rollout
  engine = FakeEngine()
  prompts = [_prompt(["one"]), _prompt(["two"])]
  multi = multiturn.sample(engine, prompts, 2, 8, 40, SamplingConfig(1.0), seed=1, step=3)
  single = rollout.sample(engine, [p.ids for p in prompts], 2, 8, seed=1, step=3)
  np.testing.assert_array_equal(multi.tokens[:, :8], single.tokens)
  np.testing.assert_array_equal(multi.mask[:, :8], single.mask)
  assert not multi.mask[:, 8:].any()
  np.testing.assert_array_equal(multi.finished, single.finished)
  np.testing.assert_array_equal(longest_answer(single.mask), single.mask.sum(-1))


def test_the_final_answer_or_each_answer_is_scored():
  def fn(convs):  # one column per fact of the scored conversation
    out = np.zeros((len(convs), 9), np.float32)
    for i, c in enumerate(convs):
      out[i, :3] = (len(c.turns), len(c.turns[-1].text), len(c.turns[-2].text))
    return out

  engine = FakeEngine()
  prompts = [_prompt(["q one", "q two, longer"]), _prompt(["alone"])]
  r = multiturn.sample(engine, prompts, 2, 8, 300, SamplingConfig(1.0), seed=3)
  scorer = HostScorer(fn)
  final = multiturn.score(r, prompts, scorer, "final")
  each = multiturn.score(r, prompts, scorer, "each")
  for b in range(4):
    p, answers = prompts[b // 2], r.answers[b]
    users = [p.request.conversation.turns[0].text, *p.request.follow_ups]
    rows = [(2 * (j + 1), len(answers[j]), len(users[j])) for j in range(len(answers))]
    np.testing.assert_allclose(final[b, :3], rows[-1])
    np.testing.assert_allclose(each[b, :3], np.mean(rows, axis=0))
  convs, owner = multiturn.conversations(r, prompts, "final")
  assert convs[0].turns[1].role == "Assistant" and convs[0].turns[2].text == "q two, longer"
  assert owner.tolist() == [0, 1, 2, 3]
  assert [len(a) for a in r.answers] == [2, 2, 1, 1]
  # No room for the next turn: the conversation ends there, not finished.
  short = multiturn.sample(engine, prompts[:1], 2, 8, 40, SamplingConfig(1.0), seed=3)
  assert [len(a) for a in short.answers] == [1, 1] and not short.finished.any()


def test_pack_reads_a_row_with_gaps_through_its_last_answer():
  engine = FakeEngine()
  prompts = [_prompt(["q one", "q two"])]
  r = multiturn.sample(engine, prompts, 2, 6, 300, SamplingConfig(1.0), seed=11)
  assert all(len(a) == 2 for a in r.answers)
  rows = objective.pack(r, 600, pad_id=0)
  for b in range(2):
    masked = np.flatnonzero(r.mask[b])
    # Each masked completion token is the target of its `at` position.
    np.testing.assert_array_equal(rows["targets"][b, rows["at"][b, masked]], r.tokens[b, masked])
    assert rows["segment_ids"][b].sum() == len(prompts[0].ids) + masked[-1] + 1
  mask = np.array([[1, 1, 0, 1, 1, 1, 0, 0], [0] * 8, [1] * 8], np.float32)
  assert longest_answer(mask).tolist() == [3, 0, 8]


def test_dialogue_takes_the_user_turns_of_helpsteer2_and_mt_bench_rows(tmp_path):
  path = tmp_path / "p.jsonl"
  rows = [{"prompt": "Hi\n<extra_id_1>Assistant\nHello!\n<extra_id_1>User\nA joke?"},
          {"question_id": 81, "category": "writing", "turns": ["Write.", "Shorter."]},
          {"prompt": "single"}]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  hs2, mt, single = steering.read_requests(str(path), {})
  assert mt.follow_ups == ("Shorter.",) and mt.extra == {"question_id": 81,
                                                           "category": "writing"}
  d = multiturn.dialogue(hs2)
  assert [t.text for t in d.conversation.turns] == ["Hi"] and d.follow_ups == ("A joke?",)
  assert multiturn.dialogue(mt) is mt and multiturn.dialogue(single) is single
  path.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"turns": []}) + "\n")
  with pytest.raises(DataError, match=r"p.jsonl.*2.*turns"):
    steering.read_requests(str(path), {})


def _rows_file(tmp_path):
  rows = [{"turns": [f"Name colour {i}.", "Another?", "Why?"][: 1 + i % 3]} for i in range(8)]
  rows.append({"prompt": "Hi\n<extra_id_1>Assistant\nHello!\n<extra_id_1>User\nA joke?"})
  path = tmp_path / "prompts.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def _multi(tmp_path, algorithm="grpo", **overrides):
  path = _rows_file(tmp_path)
  return _config(algorithm=algorithm, **{
      "rollout.multi_turn": True, "prompts.train_path": path, "prompts.eval_path": path,
      "prompts.eval_limit": 3, "rollout.max_new_tokens": 12, **overrides})


def _assert_every_turn_answered(workdir) -> None:
  train = _train_rows(workdir)
  for row in train.values():
    assert 1.0 < row["turns"] <= 3.0 and np.isfinite(row["loss"])
    assert np.isfinite(row.get("kl", 0.0))  # dapo: no KL term
  samples = [json.loads(line) for line in
             (workdir / "samples" / "iteration_000002.jsonl").read_text().splitlines()]
  assert [len(s["answers"]) for s in samples] == [1 + len(s["follow_ups"]) for s in samples]
  assert [len(s["follow_ups"]) for s in samples] == [0, 1, 2]


def test_a_multi_turn_dapo_run_answers_every_turn(tmp_path):
  """DAPO (dynamic sampling, the overlong shaping on the longest answer). PPO: the resume
  test below."""
  summary = task.run(_multi(tmp_path, algorithm="dapo", **{"train.num_steps": 2}),
                     str(tmp_path / "run"))
  assert summary["status"] == "finished"
  _assert_every_turn_answered(tmp_path / "run")


def test_single_turn_prompts_train_the_same_with_multi_turn_on(tmp_path):
  """The first answers are single-turn's: on prompts without follow-ups the wider
  completion region changes nothing but padding."""
  common = {"train.num_steps": 1, "prompts.eval_limit": 2}
  task.run(_config(algorithm="grpo", **common), str(tmp_path / "single"))
  task.run(_config(algorithm="grpo", **common, **{"rollout.multi_turn": True}),
           str(tmp_path / "multi"))
  a, b = _train_rows(tmp_path / "single")[1], _train_rows(tmp_path / "multi")[1]
  for key in ("reward", "response_length", "truncated"):
    assert a[key] == b[key], key
  for key in ("loss", "grad_norm", "kl", "entropy"):
    np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=key)
  assert b["turns"] == 1.0


def test_a_resumed_multi_turn_run_repeats_the_uninterrupted_one(tmp_path):
  """PPO (its GAE over the answers' tokens) with each answer scored: every turn answered,
  and stopped after iteration 1 and resumed, iteration 2 is the uninterrupted run's, its
  critic's too."""
  assert_resumes(_multi(tmp_path, algorithm="ppo", **{"rollout.multi_turn_reward": "each"}),
                 tmp_path, ("reward", "reward_normalized", "kl", "loss", "response_length",
                            "turns", "value_loss", "value"))
  _assert_every_turn_answered(tmp_path / "straight")


@pytest.mark.skipif(not (MT_BENCH / "question.jsonl").is_file(),
                    reason="FastChat's MT-Bench questions are not in ../shared/data/mt_bench")
def test_mt_bench_two_turn_questions_are_answered_in_both_turns(tmp_path):
  path = str(MT_BENCH / "question.jsonl")
  config = _config(algorithm="rloo", **{
      "rollout.multi_turn": True, "prompts.train_path": path, "prompts.eval_path": path,
      "prompts.eval_limit": 2, "rollout.max_new_tokens": 8, "train.seq_len": 1024,
      "train.num_steps": 1, "rollout.prompts_per_iteration": 2,
      "train.global_batch": 8, "train.micro_batch": 8})
  task.run(config, str(tmp_path))
  assert _train_rows(tmp_path)[1]["turns"] == 2.0


def test_multi_turn_settings_are_checked():
  from helpsteer_jax.errors import ConfigError
  with pytest.raises(ConfigError, match="multi_turn_reward"):
    task.run(_config(**{"rollout.multi_turn": True, "rollout.multi_turn_reward": "mean"}),
             "/nonexistent")
  with pytest.raises(ConfigError, match="max_staleness=0 for multi-turn"):
    task.run(_config(**{"rollout.multi_turn": True, "rollout.max_staleness": 1}),
             "/nonexistent")
