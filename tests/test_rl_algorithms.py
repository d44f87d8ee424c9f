"""RL algorithms as classes: the registry is the one list, each algorithm's iteration
arithmetic equals the published formulas re-derived in NumPy (TRL's RLOOTrainer,
GRPOTrainer and PPOTrainer), and a new algorithm is one class plus one registry line."""

import ast
import dataclasses
import pathlib
import re
import runpy
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.rl import algorithms, settings
from helpsteer_jax.rl.algorithms.base import Algorithm, LossSettings, per_token
from helpsteer_jax.rl.algorithms.grpo import GRPO
from helpsteer_jax.rl.algorithms.gspo import GSPO
from helpsteer_jax.rl.algorithms.ppo import PPO
from helpsteer_jax.rl.algorithms.rloo import RLOO

from conftest import REPO_ROOT

P, K, T = 3, 4, 6
TOL = dict(rtol=1e-5, atol=1e-5)


def _config(**overrides):
  config = runpy.run_path(str(REPO_ROOT / "configs" / "rl.py"))["get_config"]()
  config.update(overrides)
  return config


def _rollouts(seed=0):
  rng = np.random.default_rng(seed)
  b = P * K
  logp = -rng.uniform(0.1, 3.0, (b, T))
  ref = logp + rng.normal(0, 0.5, (b, T))
  lengths = rng.integers(1, T + 1, b)
  mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
  scores = rng.normal(0, 1, b)
  return logp * mask, ref * mask, mask, scores


class _View:
  def __init__(self, **fields):
    self.__dict__.update({k: jnp.asarray(v, jnp.float32) for k, v in fields.items()})


def test_the_registry_is_the_one_list():
  assert list(algorithms.REGISTRY) == ["rloo", "grpo", "ppo", "gspo", "dapo", "distill"]
  with pytest.raises(ConfigError, match="choose one of rloo, grpo, ppo"):
    settings.read(_config(algorithm="a2c"))
  # The docs' table has one row per registered algorithm, in order.
  doc = (REPO_ROOT / "docs" / "tasks" / "rl.md").read_text()
  table = doc.split("| `algorithm` | advantage |", 1)[1].split("\n\n", 1)[0]
  assert re.findall(r"^\| `(\w+)` \| ", table, re.M) == list(algorithms.REGISTRY)
  for name, cls in algorithms.REGISTRY.items():
    s = settings.read(_config(algorithm=name))
    assert type(s.algorithm) is cls and s.algorithm.name == name


def test_no_algorithm_is_named_outside_its_module():
  """Code asks an algorithm what it needs; only `rl/algorithms/` knows their names."""
  names = set(algorithms.REGISTRY)
  offenders = []
  for path in (REPO_ROOT / "helpsteer_jax").rglob("*.py"):
    if "algorithms" in path.relative_to(REPO_ROOT).parts:
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Compare):
        for side in (node.left, *node.comparators):
          consts = [side] if isinstance(side, ast.Constant) else (
              list(side.elts) if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [])
          if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
            offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
  assert not offenders, offenders


def test_each_algorithm_reads_and_checks_its_own_settings():
  s = settings.read(_config(algorithm="grpo", **{"loss": {**_config().loss.to_dict(),
                                                          "beta": 0.0}}))
  assert s.algorithm == GRPO(beta=0.0, scale_advantages=True)
  assert not s.uses_reference and s.aggregation == "sequence"
  s = settings.read(_config(algorithm="rloo"))
  assert s.algorithm.kl_coef == 0.05 and s.uses_reference and s.aggregation == "token"
  config = _config(algorithm="ppo")
  config.loss.update(critic_init="value_head", gamma=1.5)
  with pytest.raises(ConfigError, match="critic_init='value_head'.*loss.gamma=1.5"):
    settings.read(config)
  config = _config(algorithm="rloo")
  config.loss.kl_coef = -1.0
  with pytest.raises(ConfigError, match="loss.kl_coef=-1.0 must be >= 0"):
    settings.read(config)
  config.algorithm = "grpo"  # rloo's coefficient is not grpo's
  settings.read(config)


def test_rloo_folds_the_kl_into_the_reward_and_leaves_one_out():
  logp, ref, mask, scores = _rollouts(1)
  algo = RLOO(kl_coef=0.1)
  shaped = algo.shape_scores(scores, logp, ref, mask)
  want_scores = scores - 0.1 * ((logp - ref) * mask).sum(-1)  # TRL's rlhf_reward
  np.testing.assert_allclose(shaped, want_scores, **TOL)
  got = algo.advantages({"mask": mask}, shaped, K, logp, ref)
  groups = want_scores.reshape(P, K)
  want = (groups - (groups.sum(1, keepdims=True) - groups) / (K - 1)).reshape(-1)
  np.testing.assert_allclose(got, want[:, None] * mask, **TOL)
  assert RLOO(kl_coef=0.0).shape_scores(scores, logp, ref, mask) is scores


def _np_trl_rloo_loss(logp, old, adv, mask, eps_low, eps_high):
  """TRL 1.9 RLOOTrainer `_compute_loss`: logps = (per_token_logps * mask).sum(1), the
  same of the old ones; coef_1 = exp(logps - old_logps), clamped; -min(...).mean()."""
  losses = []
  for i in range(len(adv)):
    log_ratio = sum((logp[i, t] - old[i, t]) * mask[i, t] for t in range(T))
    coef_1 = np.exp(log_ratio)
    coef_2 = min(max(coef_1, 1 - eps_low), 1 + eps_high)
    losses.append(-min(coef_1 * adv[i], coef_2 * adv[i]))
  return np.mean(losses)


def test_rloo_in_trl_s_form():
  """`loss.rloo_form=trl`: TRL RLOOTrainer's sequence ratio and per-completion mean, its
  whitening eps 1e-4; at ratio 1 the token form's gradient is B / N_tok times it."""
  config = _config(algorithm="rloo")
  config.loss.rloo_form = "trl"
  s = settings.read(config)
  assert s.algorithm == RLOO(kl_coef=0.05, rloo_form="trl") and s.aggregation == "sequence"
  config.loss.aggregation = "token"
  with pytest.raises(ConfigError, match="loss.aggregation='token'.*'sequence'"):
    settings.read(config)
  config.loss.update(aggregation="", rloo_form="nemo")
  with pytest.raises(ConfigError, match="loss.rloo_form='nemo'"):
    settings.read(config)

  logp, ref, mask, scores = _rollouts(8)
  trl, token = RLOO(rloo_form="trl"), RLOO()
  shaped = trl.shape_scores(scores, logp, ref, mask)
  np.testing.assert_allclose(shaped, token.shape_scores(scores, logp, ref, mask))
  adv = trl.advantages({"mask": mask}, shaped, K, logp, ref)
  g = shaped.reshape(P, K)
  loo = (g - (g.sum(1, keepdims=True) - g) / (K - 1)).reshape(-1)
  np.testing.assert_allclose(adv, loo[:, None] * mask, **TOL)
  for algo, eps in ((RLOO(normalize_advantages=True, rloo_form="trl"), 1e-4),
                    (RLOO(normalize_advantages=True), 1e-8)):
    got = algo.advantages({"mask": mask}, shaped, K, logp, ref)
    want = (loo - loo.mean()) / (loo.std(ddof=1) + eps)  # TRL 1.9: nanstd + 1e-4
    np.testing.assert_allclose(got, want[:, None] * mask, **TOL)

  old = logp + np.random.default_rng(9).normal(0, 0.05, logp.shape) * mask
  view = _View(advantages=adv, mask=mask)
  common = dataclasses.replace(settings.read(_config(algorithm="rloo")).loss,
                               aggregation="sequence", max_tokens=T)
  lp, o = (jnp.asarray(x, jnp.float32) for x in (logp, old))
  total, weight, sums = trl.loss_sums(lp, o, view, common)
  np.testing.assert_allclose(total / weight, _np_trl_rloo_loss(logp, old, loo, mask, 0.2, 0.2),
                             **TOL)
  assert 0 < float(sums["clipped"]) < mask.sum()

  def loss(x, algo, aggregation):
    c = dataclasses.replace(common, aggregation=aggregation)
    total, weight, _ = algo.loss_sums(x, jax.lax.stop_gradient(x), view, c)
    return total / weight

  g_trl = jax.grad(loss)(lp, trl, "sequence")
  g_token = jax.grad(loss)(lp, token, "token")
  b, n_tok = len(loo), mask.sum()
  np.testing.assert_allclose(g_trl, -loo[:, None] * mask / b, **TOL)
  np.testing.assert_allclose(g_token, g_trl * b / n_tok, **TOL)


@pytest.mark.parametrize("scale", [True, False])
def test_grpo_advantages_and_the_kl_only_with_beta(scale):
  logp, ref, mask, scores = _rollouts(2)
  algo = GRPO(beta=0.04, scale_advantages=scale)
  assert algo.shape_scores(scores, logp, ref, mask) is scores
  got = algo.advantages({"mask": mask}, scores, K, logp, ref)
  g = scores.reshape(P, K)
  want = g - g.mean(1, keepdims=True)
  if scale:
    want = want / (g.std(1, ddof=1, keepdims=True) + 1e-4)
  np.testing.assert_allclose(got, want.reshape(-1)[:, None] * mask, **TOL)

  common = LossSettings(eps_low=0.2, eps_high=0.2, aggregation="token", max_tokens=T)
  view = _View(advantages=got, mask=mask, ref_logp=ref)
  lp = jnp.asarray(logp, jnp.float32)
  _, _, with_kl = algo.loss_sums(lp, lp, view, common)
  k3 = np.exp(ref - logp) - (ref - logp) - 1
  np.testing.assert_allclose(with_kl["kl"], (k3 * mask).sum(), **TOL)
  total0, _, without = dataclasses.replace(algo, beta=0.0).loss_sums(lp, lp, view, common)
  assert "kl" not in without
  # Ratio 1: the loss is minus the advantages' token mean.
  np.testing.assert_allclose(total0, -(got * mask).sum(), **TOL)


def test_gspo_takes_the_paper_s_defaults_and_a_sequence_ratio():
  """GSPO's defaults (the paper's, as TRL 1.9's paper index sets them): eps 3e-4 / 4e-4,
  beta 0, the loss averaged per completion; GRPO's stay 0.2 / 0.2 and 0.04."""
  s = settings.read(_config(algorithm="gspo"))
  assert s.algorithm == GSPO(beta=0.0, scale_advantages=True, importance_level="sequence")
  assert (s.eps_low, s.eps_high, s.aggregation) == (3e-4, 4e-4, "sequence")
  assert not s.uses_reference
  g = settings.read(_config(algorithm="grpo"))
  assert (g.eps_low, g.eps_high, g.algorithm.beta) == (0.2, 0.2, 0.04)
  assert g.algorithm.importance_level == "token"
  config = _config(algorithm="gspo")
  config.loss.update(importance_level="sequence_token", eps_low=1e-3, beta=0.01)
  s = settings.read(config)
  assert s.algorithm.importance_level == "sequence_token" and s.uses_reference
  assert (s.eps_low, s.eps_high) == (1e-3, 4e-4)
  config.loss.importance_level = "token"
  with pytest.raises(ConfigError, match="loss.importance_level='token'"):
    settings.read(config)

  logp, ref, mask, scores = _rollouts(6)
  algo = GSPO()
  adv = algo.advantages({"mask": mask}, scores, K, logp, ref)
  np.testing.assert_allclose(adv, GRPO().advantages({"mask": mask}, scores, K, logp, ref))
  old = logp + np.random.default_rng(7).normal(0, 1e-3, logp.shape) * mask
  view = _View(advantages=adv, mask=mask, ref_logp=ref)
  common = LossSettings(eps_low=3e-4, eps_high=4e-4, aggregation="sequence", max_tokens=T)
  total, weight, sums = algo.loss_sums(*(jnp.asarray(x, jnp.float32) for x in (logp, old)),
                                       view, common)
  n = mask.sum(-1)
  ratio = np.exp(((logp - old) * mask).sum(-1) / n)  # one per completion
  a = adv[:, 0]
  want = -np.minimum(ratio * a, np.clip(ratio, 1 - 3e-4, 1 + 4e-4) * a)
  np.testing.assert_allclose(total / weight, want.mean(), **TOL)
  assert "kl" not in sums


class _Critic:
  def __init__(self, values):
    self._values = values

  def values(self, rows):
    return self._values


def test_ppo_gae_on_the_critic_s_values():
  """TRL PPOTrainer: per-token rewards -kl_coef (log pi - log ref), the score at the last
  token; GAE's backward recursion; advantages whitened over the batch's tokens."""
  logp, ref, mask, scores = _rollouts(3)
  values = np.random.default_rng(4).normal(0, 1, logp.shape).astype(np.float32)
  algo = PPO(kl_coef=0.05, gamma=0.99, lam=0.9)
  rows = {"mask": mask}
  got = algo.advantages(rows, scores, K, logp, ref, _Critic(values))
  b = len(scores)
  rewards = -0.05 * (logp - ref) * mask
  for i in range(b):
    rewards[i, int(mask[i].sum()) - 1] += scores[i]
  v = values * mask
  adv = np.zeros((b, T))
  for i in range(b):
    last = 0.0
    for t in reversed(range(T)):
      nxt = v[i, t + 1] if t < T - 1 else 0.0
      last = (rewards[i, t] + 0.99 * nxt - v[i, t]) * mask[i, t] + 0.99 * 0.9 * last
      adv[i, t] = last
  adv *= mask
  np.testing.assert_allclose(rows["returns"], (adv + v) * mask, **TOL)
  np.testing.assert_allclose(rows["old_values"], v, **TOL)
  valid = adv[mask > 0]
  want = (adv - valid.mean()) / np.sqrt(valid.var(ddof=1) + 1e-8) * mask
  np.testing.assert_allclose(got, want, **TOL)


@dataclasses.dataclass(frozen=True)
class _Reinforce(Algorithm):
  """REINFORCE with the batch-mean baseline: what a new algorithm's module holds."""
  name: ClassVar[str] = "reinforce"
  needs_old_logprobs: ClassVar[bool] = True

  baseline_coef: float = 1.0

  def problems(self):
    return [] if self.baseline_coef >= 0 else ["loss.baseline_coef must be >= 0"]

  def advantages(self, rows, scores, k, logp, ref_logp, critic=None):
    return per_token(scores - self.baseline_coef * scores.mean(), rows["mask"])


def test_a_new_algorithm_is_one_class_and_one_registry_line(monkeypatch):
  monkeypatch.setitem(algorithms.REGISTRY, "reinforce", _Reinforce)
  config = _config(algorithm="reinforce")
  config.rollout.samples_per_prompt = 1  # no group baseline: one sample per prompt is fine
  config.train.global_batch = 16
  config.loss.baseline_coef = 0.5
  s = settings.read(config)
  assert s.algorithm == _Reinforce(baseline_coef=0.5)
  assert s.recomputes_old_logp and not s.uses_reference
  logp, ref, mask, scores = _rollouts(5)
  got = s.algorithm.advantages({"mask": mask}, scores, 1, logp, ref)
  np.testing.assert_allclose(got, (scores - 0.5 * scores.mean())[:, None] * mask, **TOL)
  config.loss.baseline_coef = -1.0
  with pytest.raises(ConfigError, match="baseline_coef"):
    settings.read(config)
  assert pathlib.Path(algorithms.__file__).read_text().count("REGISTRY") == 1
