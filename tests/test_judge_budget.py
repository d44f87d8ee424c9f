"""A generative judge's token budget (scorer.max_len - scorer.judge_max_new_tokens): one
that cannot judge anything is refused before the judge's weights load, naming the
setting that makes it fit; a task's own prompts are checked before anything compiles
(RL's and iterative DPO's left out when a judge has no room for them); evaluate_rm that
judged nothing exits non-zero naming why; an RL group whose GenRM answers do not parse
gets the neutral reward instead of stopping the run, and a NaN reward names its cause."""

import json
from unittest import mock

import numpy as np
import pytest
from test_genrm_rl import _convs, tiny  # noqa: F401 - the module's tiny judge fixture

from helpsteer_jax import runtime
from helpsteer_jax.config_sections import scorer_section
from helpsteer_jax.configs import rl as rl_config
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import sample_score, steering
from helpsteer_jax.judges import genrm
from helpsteer_jax.load import model as loader
from helpsteer_jax.rl import rewards as rl_rewards
from helpsteer_jax.scoring import genrm as genrm_scoring
from helpsteer_jax.scoring import judge_budget, load
from helpsteer_jax.scoring.combine import CombinedScorer
from helpsteer_jax.scoring.judge_budget import Budget
from helpsteer_jax.scoring.scorer import HostScorer

from cli_utils import run_main

HELP = ATTRIBUTES.index("helpfulness")


def test_a_refusal_names_the_settings_that_fit():
  genrm_budget = Budget(256, 512, 1)
  assert genrm_budget.prompt == -256
  assert str(genrm_budget.refusal(100, "judge prompt")).endswith(
      "leaves -256 tokens for a judge prompt, and the shortest is 100 tokens: raise"
      " scorer.max_len to at least 612 or lower scorer.judge_max_new_tokens to at most 156")
  assert str(Budget(1000, 512, 1).refusal(700, "row")).endswith(
      "raise scorer.max_len to at least 1212 or lower scorer.judge_max_new_tokens to at most"
      " 300")
  # a principle judge can do without reasoning (0: one pass); a GenRM needs its answer
  assert "to at most 0" in str(Budget(600, 512, 0).refusal(600, "row"))
  assert "lower" not in str(Budget(600, 512, 1).refusal(600, "row"))
  Budget(600, 100).check(500, "row")
  with pytest.raises(ConfigError, match="shortest is 501"):
    Budget(600, 100).check(501, "row")


class _Budgeted(HostScorer):
  """A scorer with a local judge's budget whose prompts are as long as their text."""

  def __init__(self, budget):
    super().__init__(lambda convs: np.zeros((len(convs), len(ATTRIBUTES))))
    self.budget = budget

  def prompt_tokens(self, group):
    return np.asarray([len(c.turns[0].text) for c in group])


def _request(text):
  return steering.make_request(text, {})


def test_fitting_keeps_what_fits_and_refuses_when_nothing_does(caplog):
  scorer = _Budgeted(Budget(20, 10))
  requests = [_request("x" * n) for n in (5, 10, 11, 30)]
  assert sample_score.judged(scorer, requests, "prompt").tolist() == [True, True, False, False]
  assert "2 of 4 prompts have judge prompts over 10 tokens" in caplog.text
  with pytest.raises(ConfigError, match="fits no prompt: .* the shortest is 11 tokens: raise"
                     " scorer.max_len to at least 21 or lower scorer.judge_max_new_tokens to"
                     " at most 9"):
    sample_score.judged(scorer, requests[2:], "prompt")
  # a scorer without a local judge's budget: nothing to check
  plain = HostScorer(lambda convs: np.zeros((len(convs), len(ATTRIBUTES))))
  assert sample_score.judged(plain, requests, "prompt").all()
  # the attribute model and a principle judge: the judge's budget
  both = CombinedScorer(plain, scorer, 1.0)
  assert sample_score.judged(both, requests, "prompt").tolist() == [True, True, False, False]


class _Answers:
  """Judge prompts answered by `reply(prompt)`; those longer than the budget not asked."""

  def __init__(self, reply, budget):
    self.reply, self.budget = reply, budget

  def tokens(self, text):
    return len(text)

  def __call__(self, prompts):
    return [self.reply(p) if len(p) <= self.budget.prompt else None for p in prompts]


def test_a_genrm_judge_counts_its_judgements_and_stands_in_for_parse_failures():
  convs = _convs()  # a group of three answers to one context, then one alone
  judge = genrm_scoring.GenrmJudge(_Answers(lambda p: "no boxes", Budget(10_000, 8, 1)),
                                   guidelines=False, budget=Budget(10_000, 8, 1))
  lengths = judge.prompt_tokens(convs[:3])
  pairs, prompts = judge.prompts(convs[:3])
  assert lengths.tolist() == [min(len(t) for (i, j), t in zip(pairs, prompts) if k in (i, j))
                              for k in range(3)]
  assert np.isnan(judge(convs)).all()
  assert judge.counts == {"answered": 7, "not_asked": 0, "not_parsed": 7}
  # RL's judge: an answered completion whose judgements did not parse gets the neutral
  # reward; one none of whose pairs fit the budget stays unscored
  budget = Budget(int(lengths.max()) + 8, 8, 1)
  rl_judge = genrm_scoring.GenrmJudge(_Answers(lambda p: "no boxes", budget),
                                      guidelines=False, budget=budget,
                                      unparsed=genrm.NEUTRAL["mean_score"])
  long_one = Conversation("sys", (Turn("User", "Capital of Peru?" * 40),)).answered("Lima")
  rows = rl_judge(convs[:3] + [long_one])
  assert rows[:3, HELP].tolist() == [3.0] * 3 and np.isnan(rows[3]).all()
  assert rl_judge.counts["not_asked"] >= 1 and rl_judge.counts["not_parsed"] >= 1


def test_unscored_rollouts_name_their_cause():
  local = scorer_section(source="/runs/genrm", judge="genrm", max_len=4096,
                         judge_max_new_tokens=512)
  cause = load.unscored_cause(local)
  assert "do not parse" in cause and "scorer.max_len=4096 - scorer.judge_max_new_tokens=512" \
      in cause
  served = scorer_section(source="http://judge:8000/v1", judge="genrm")
  assert "max_len" not in load.unscored_cause(served)  # a server refuses what is too long
  rl_judge = genrm_scoring.GenrmJudge(lambda prompts: [], unparsed=3.0, budget=Budget(9, 1, 1))
  rl_judge.counts.update(answered=6, not_asked=2, not_parsed=6)
  cause = load.unscored_cause(local, rl_judge)  # parse failures have a reward: the budget
  assert "do not parse" not in cause and "2 prompts were over that budget" in cause
  principle = scorer_section(source="/runs/judge", judge="principle", max_len=1024)
  assert "principle judge's inputs are longer than scorer.max_len=1024" in \
      load.unscored_cause(principle)
  dropped = scorer_section(source="/runs/rm", truncation="drop", max_len=512)
  assert "scorer.truncation=truncate_left" in load.unscored_cause(dropped)
  with pytest.raises(ConfigError, match="could not score rollouts \\[1\\]: their pairs'"):
    rl_rewards.rollout_rewards(np.asarray([[0.0] * 9, [np.nan] * 9]), np.ones(9),
                               unscored=load.unscored_cause(local, rl_judge))


def _rt():
  config = rl_config.get_config()
  config.mesh.update(data=1, fsdp=-1, tensor=1)
  return runtime.setup(config)


def _refused(section, match):
  """ConfigError matching `match`, raised before the judge's weights load."""
  with mock.patch.object(loader, "load_model", side_effect=AssertionError("weights loaded")):
    with pytest.raises(ConfigError, match=match) as err:
      load.load_scorer(section, _rt())
  return str(err.value)


def test_local_judges_at_a_budget_of_nothing_are_refused_before_loading(tiny):  # noqa: F811
  root, _ = tiny
  lm = str(root / "lm")
  # evaluate_rm's defaults: 256 - 512 = -256
  _refused(scorer_section(source=lm, judge="genrm", max_len=256), "leaves -256 tokens")
  message = _refused(scorer_section(source=lm, judge="genrm", max_len=256,
                                    judge_guidelines=False),
                     r"leaves -256 tokens .* raise scorer.max_len to at least \d+$")
  least = int(message.rsplit(" ", 1)[1])
  short = scorer_section(source=lm, judge="genrm", max_len=least - 1, judge_guidelines=False)
  _refused(short, f"at least {least}")
  short.max_len = least
  assert isinstance(load.load_scorer(short, _rt()), genrm_scoring.GenrmJudge)
  # the reasoning principle judge, and the one-pass one on a row shorter than its prompt
  _refused(scorer_section(source=lm, judge="principle", max_len=256), "leaves -256 tokens")
  _refused(scorer_section(source=lm, judge="principle", judge_max_new_tokens=0, max_len=64,
                          principle="Be brief."), "leaves 64 tokens")


def _pairs_file(path, n=2):
  rows = [{"prompt": f"What is {i} plus {i}?", "response_1": f"{2 * i}.",
           "response_2": "I do not know.", "preference_strength": -2, "split": "validation"}
          for i in range(n)]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def test_evaluate_rm_with_a_judge_that_judges_nothing_exits_non_zero(tiny, tmp_path):  # noqa: F811
  """The reproduction: a GenRM at evaluate_rm's defaults is refused before compiling; at a
  budget that fits, a random model's answers never parse: the report shows NaN beside a
  count of 0 and the run exits 2 naming why."""
  root, _ = tiny
  judge = ("--config=configs/evaluate_rm.py", "--config.scorer.judge=genrm",
           f"--config.scorer.source={root / 'lm'}")
  proc = run_main(*judge, f"--workdir={tmp_path / 'a'}", devices=1, check=False)
  assert proc.returncode == 2 and "raise scorer.max_len to at least" in proc.stderr
  assert not (tmp_path / "a" / "rm_report.json").exists()
  pairs = _pairs_file(tmp_path / "pairs.jsonl")
  proc = run_main(*judge, "--config.scorer.judge_guidelines=false",
                  "--config.scorer.max_len=512", "--config.scorer.judge_max_new_tokens=8",
                  f"--config.data.preference_path={pairs}", f"--workdir={tmp_path / 'b'}",
                  devices=1, check=False)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "nothing of helpsteer2_preference was scored" in proc.stderr
  assert "do not parse" in proc.stderr and "4 answers did not parse" in proc.stderr
  report = json.loads((tmp_path / "b" / "rm_report.json").read_text())
  pairs_result = report["helpsteer2_preference"]
  assert pairs_result["count"] == 0 and pairs_result["accuracy"] is None
  assert "| all | 0 | 0 | nan |" in proc.stdout


def test_rl_with_a_genrm_whose_answers_never_parse_runs_on_neutral_rewards(tiny, tmp_path):  # noqa: F811
  """RL with a local GenRM judge (a random model: no answer parses) as the reward: before,
  the first group stopped the run with "too long for the attribute model"; now every
  completion gets the neutral reward (3, the middle of 1-5) and the iteration trains."""
  root, _ = tiny
  run_main("--config=configs/rl.py", "--config.init.source=",
           f"--config.tokenizer={root / 'tok'}", "--config.model.hidden_size=64",
           "--config.model.intermediate_size=128", "--config.model.num_layers=2",
           "--config.scorer.judge=genrm", f"--config.scorer.source={root / 'lm'}",
           "--config.scorer.judge_guidelines=false", "--config.scorer.max_len=512",
           "--config.scorer.judge_max_new_tokens=8", "--config.scorer.batch_size=8",
           *(f"--config.scorer.weights.{a}={float(a == 'helpfulness')}" for a in ATTRIBUTES),
           "--config.train.num_steps=1", "--config.train.eval_every=0",
           "--config.rollout.prompts_per_iteration=2", "--config.rollout.samples_per_prompt=2",
           "--config.rollout.max_new_tokens=8", "--config.train.global_batch=4",
           "--config.train.micro_batch=4", "--config.train.seq_len=128",
           "--config.train.export_hf=false", "--config.prompts.demo_train_prompts=4",
           f"--workdir={tmp_path / 'run'}", devices=1)
  metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
             .splitlines()]
  assert [m["reward"] for m in metrics if "reward" in m] == [genrm.NEUTRAL["mean_score"]]


def test_judge_budget_has_no_opinion_without_groups():
  assert judge_budget.fitting(_Budgeted(Budget(1, 5)), [], "row").tolist() == []


def test_evaluate_rm_refuses_attribute_metrics_for_a_judge(tmp_path):
  from helpsteer_jax.tasks import evaluate_rm

  from task_configs import short_config
  config = short_config("evaluate_rm", scorer={"judge": "genrm", "source": str(tmp_path)},
                        data={"validation_path": str(tmp_path / "rows.jsonl")})
  with pytest.raises(ConfigError, match="one reward per response, not the attributes"):
    evaluate_rm.run(config, str(tmp_path / "run"))


def test_the_server_refuses_a_judge_budget_before_loading_its_policy(tiny, tmp_path):  # noqa: F811
  root, _ = tiny
  proc = run_main("--config=configs/serve.py", f"--config.init.source={root / 'nowhere'}",
                  "--config.scorer.judge=principle", f"--config.scorer.source={root / 'lm'}",
                  "--config.scorer.max_len=256", f"--workdir={tmp_path}", devices=1,
                  check=False)
  assert proc.returncode == 2
  assert "scorer.max_len=256 - scorer.judge_max_new_tokens=512" in proc.stderr, proc.stderr


def test_best_of_n_refuses_a_judge_with_room_for_no_request(monkeypatch):
  from helpsteer_jax.tasks import generate

  from train_utils import task_config
  monkeypatch.setattr(generate, "load_scorer", lambda section, rt: _Budgeted(Budget(20, 10)))
  config = task_config("generate")
  config.best_of_n.n = 2
  with pytest.raises(ConfigError, match="fits no prompt: .* the shortest is 30 tokens"):
    generate.best_of_n_scorer(config, None, [_request("x" * 30)])
  assert isinstance(generate.best_of_n_scorer(config, None, [_request("x")]), _Budgeted)
