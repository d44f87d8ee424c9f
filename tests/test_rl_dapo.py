"""DAPO (overlong shaping, dynamic sampling, clip-higher with the token-level loss) and
the sampler correction (truncated importance sampling), each against a NumPy
re-derivation of the published formula and its reference code: DAPO's Eq. 13 and verl's
DAPO reward manager, TRL 1.9 GRPOTrainer's `loss_type="dapo"` and its
`vllm_importance_sampling_mode`s; then end to end, resumed, and with bf16 rollouts of an
fp32 update."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from test_rl_task import _config, _train_rows

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.losses import advantages as adv_lib
from helpsteer_jax.losses import sampler_correction
from helpsteer_jax.rl import dynamic_sampling, settings
from helpsteer_jax.rl.algorithms.base import LossSettings
from helpsteer_jax.rl.algorithms.dapo import DAPO
from helpsteer_jax.rl.rollout import Rollouts
from helpsteer_jax.tasks import rl as task

TOL = dict(rtol=1e-5, atol=1e-5)


class _View:
  def __init__(self, **fields):
    self.__dict__.update({k: jnp.asarray(v, jnp.float32) for k, v in fields.items()})


def _overlong_reference(length, max_len, buffer, factor):
  """DAPO's Eq. 13 (times verl's penalty factor), case by case."""
  if length <= max_len - buffer:
    return 0.0
  if length <= max_len:
    return factor * ((max_len - buffer) - length) / buffer
  return -factor


@pytest.mark.parametrize("k", [2, 8])
def test_overlong_shaping_is_dapo_eq13(k):
  max_len, buffer, factor = 64, 16, 0.7
  rng = np.random.default_rng(k)
  lengths = rng.integers(1, max_len + 1, size=4 * k)
  lengths[:3] = (max_len - buffer, max_len - buffer + 1, max_len)  # the kinks; truncated
  got = adv_lib.overlong_penalty(lengths, max_len, buffer, factor)
  want = [_overlong_reference(n, max_len, buffer, factor) for n in lengths]
  np.testing.assert_allclose(got, want, **TOL)
  assert got[0] == 0.0 and got[2] == pytest.approx(-factor)
  # The algorithm adds it to the scores; off (buffer 0) it returns them untouched.
  scores = rng.normal(size=4 * k).astype(np.float32)
  algo = DAPO(overlong_buffer=buffer, overlong_penalty=factor)
  np.testing.assert_allclose(algo.length_scores(scores, lengths, max_len), scores + want, **TOL)
  off = DAPO(overlong_buffer=0)
  assert off.length_scores(scores, lengths, max_len) is scores


def _trl_dapo_loss(logp, old, adv, mask, eps_low, eps_high, is_ratio=None):
  """TRL 1.9 GRPOTrainer._compute_loss, loss_type="dapo", beta 0: -min(c1 A, c2 A) per
  token (times the IS ratio), summed over the mask, over the batch's tokens."""
  coef_1 = np.exp(logp - old)
  coef_2 = np.clip(coef_1, 1 - eps_low, 1 + eps_high)
  a = adv[:, None]
  per_token = -np.minimum(coef_1 * a, coef_2 * a)
  if is_ratio is not None:
    per_token = per_token * is_ratio
  return (per_token * mask).sum() / mask.sum()


def _grpo_advantages(scores, k):
  g = scores.reshape(-1, k)
  adv = (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-4)
  adv[g.max(1) == g.min(1)] = 0.0
  return adv.reshape(-1)


@pytest.mark.parametrize("k", [2, 8])
def test_dapo_iteration_matches_trl_and_the_paper(k):
  """Overlong-shaped scores, GRPO's group advantages (an equal group exactly 0), and the
  token-level clip-higher loss off ratio 1 with masked tails and truncated rows."""
  p, t, max_len = 3, 10, 10
  rng = np.random.default_rng(10 + k)
  algo = DAPO().resolved(max_len)
  assert (algo.overlong_buffer, algo.beta, algo.dynamic_sampling_rounds) == (2, 0.0, 10)
  lengths = rng.integers(1, t + 1, size=p * k)
  lengths[:k] = t  # a group of completions cut at the limit
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  raw = rng.normal(size=p * k).astype(np.float32)
  raw[k:2 * k] = 0.5  # an equal group, all of whose lengths are below the buffer
  lengths[k:2 * k] = 3
  mask[k:2 * k] = (np.arange(t)[None] < 3).astype(np.float32)
  scores = algo.length_scores(raw, lengths, max_len)
  want_scores = raw + np.asarray([_overlong_reference(n, max_len, 2, 1.0) for n in lengths])
  np.testing.assert_allclose(scores, want_scores, **TOL)
  got = algo.advantages({"mask": mask}, scores, k, None, None)
  want_adv = _grpo_advantages(want_scores.astype(np.float32), k)
  np.testing.assert_allclose(got, want_adv[:, None] * mask, **TOL)
  assert not got[k:2 * k].any()

  old = rng.normal(-2, 0.5, size=(p * k, t)).astype(np.float32)
  logp = old + rng.normal(0, 0.3, size=old.shape).astype(np.float32)
  common = LossSettings(0.2, 0.28, "token", max_len)
  view = _View(advantages=got, mask=mask, ref_logp=np.zeros_like(old))
  total, weight, _ = algo.loss_sums(jnp.asarray(logp), jnp.asarray(old), view, common)
  want = _trl_dapo_loss(logp, old, want_adv, mask, 0.2, 0.28)
  np.testing.assert_allclose(float(total / weight), want, **TOL)


def _trl_is_ratio(old, sampler, mask, mode, cap):
  """TRL 1.9 GRPOTrainer._generate_and_score_completions' vLLM importance sampling ratio."""
  diff = (old - sampler) * mask
  if mode.startswith("sequence"):
    diff = diff.sum(-1, keepdims=True)
  ratio = np.exp(diff)
  if mode.endswith("truncate"):
    return np.minimum(ratio, cap)
  return np.where(ratio > cap, 0.0, ratio)


@pytest.mark.parametrize("mode", sampler_correction.MODES)
@pytest.mark.parametrize("k", [2, 8])
def test_sampler_correction_matches_trl(mode, k):
  b, t, cap = 2 * k, 12, 1.3
  rng = np.random.default_rng(k)
  lengths = rng.integers(1, t + 1, size=b)
  lengths[0] = t  # truncated
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  old = rng.normal(-2, 0.5, size=(b, t)).astype(np.float32)
  sampler = old + rng.normal(0, 0.15, size=old.shape).astype(np.float32)
  got = sampler_correction.weights(old, sampler, mask, mode, cap)
  want = np.broadcast_to(_trl_is_ratio(old, sampler, mask, mode, cap), mask.shape) * mask
  np.testing.assert_allclose(got, want, **TOL)
  if mode.endswith("mask"):
    assert (got[mask > 0] == 0).any() or (want[mask > 0] <= cap).all()

  # In the loss: the surrogate per token times the weight, then beta * k3 KL, then the
  # per-completion mean (TRL's loss_type="grpo"), off ratio 1.
  logp = old + rng.normal(0, 0.2, size=old.shape).astype(np.float32)
  ref = old + rng.normal(0, 0.1, size=old.shape).astype(np.float32)
  adv = rng.normal(size=b).astype(np.float32)
  from helpsteer_jax.rl.algorithms.grpo import GRPO
  algo = GRPO(beta=0.04)
  common = LossSettings(0.2, 0.2, "sequence", t, sampler_correction=True)
  view = _View(advantages=adv[:, None] * mask, mask=mask, ref_logp=ref, sampler_weight=got)
  total, weight, _ = algo.loss_sums(jnp.asarray(logp), jnp.asarray(old), view, common)
  coef_1 = np.exp(logp - old)
  per_token = -np.minimum(coef_1 * adv[:, None],
                          np.clip(coef_1, 0.8, 1.2) * adv[:, None]) * want
  per_token += 0.04 * (np.exp(ref - logp) - (ref - logp) - 1)
  trl = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
  np.testing.assert_allclose(float(total / weight), trl, **TOL)


def test_mismatch_metrics():
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
  old = np.log(np.array([[0.5, 0.2, 0.1, 0.3], [0.4, 0.4, 0.2, 0.9]], np.float32))
  sampler = np.log(np.array([[0.4, 0.25, 0.1, 0.9], [0.5, 0.4, 0.2, 0.1]], np.float32))
  w = sampler_correction.weights(old, sampler, mask, "token_truncate", 1.2)
  m = sampler_correction.metrics(old, sampler, mask, w, "token_truncate")
  d = ((old - sampler) * mask)[mask > 0]
  assert m["mismatch_kl"] == pytest.approx(-d.mean(), rel=1e-5)
  assert m["mismatch_kl_k3"] == pytest.approx((np.exp(d) - d - 1).mean(), rel=1e-5)
  assert m["is_weight_max"] == pytest.approx(1.2) and m["is_capped"] == pytest.approx(1 / 5)


def _round(indices, scores, k, t=4):
  n = len(indices) * k
  r = Rollouts([[i] for i in indices], k, np.tile(np.arange(n)[:, None], (1, t)),
               np.ones((n, t), np.float32), np.zeros((n, t), np.float32),
               np.ones(n, bool), [str(i) for i in range(n)])
  preds = np.zeros((n, 9), np.float32)
  return dynamic_sampling.Round(list(indices), r, preds, np.asarray(scores, np.float32),
                                np.asarray(scores, np.float32))


def test_dynamic_sampling_replaces_equal_groups_from_further_prompts():
  k = 2
  script = {0: [1, 1, 0, 1, 2, 2],   # groups 0 and 2 are equal
            1: [0, 0, 3, 3, 5, 5],   # all equal
            2: [1, 0, 4, 4, 0, 2]}   # groups 0 and 2 differ
  calls = []

  def sample_round(r, indices):
    calls.append((r, list(indices)))
    return _round(indices, script[r][:len(indices) * k], k)

  batch, metrics = dynamic_sampling.collect(sample_round, [5, 6, 7], 20, k, 4, seed=1,
                                            iteration=3)
  assert [r for r, _ in calls] == [0, 1, 2]  # stopped once 3 unequal groups were in hand
  seen = [i for _, idx in calls for i in idx]
  assert len(seen) == len(set(seen))  # further prompts are new ones
  assert batch.prompts == [6, calls[2][1][0], calls[2][1][2]]
  np.testing.assert_array_equal(batch.scores, [0, 1, 1, 0, 0, 2])
  assert batch.rollouts.tokens.shape == (6, 4) and len(batch.rollouts.prompts) == 3
  assert metrics == {"dynamic_rounds": 2.0, "dynamic_drop_rate": 6 / 9,
                     "dynamic_filled": 0.0}
  # The same call again draws the same further prompts (every process, a resumed run).
  calls.clear()
  again, _ = dynamic_sampling.collect(sample_round, [5, 6, 7], 20, k, 4, seed=1, iteration=3)
  assert again.prompts == batch.prompts

  # Rounds exhausted: the dropped groups fill the batch (zero advantage), counted.
  batch, metrics = dynamic_sampling.collect(
      lambda r, idx: _round(idx, [1.0] * (len(idx) * k), k), [0, 1, 2], 20, k, 2, 0, 0)
  assert metrics["dynamic_rounds"] == 2.0 and metrics["dynamic_filled"] == 3.0
  assert metrics["dynamic_drop_rate"] == 1.0 and batch.prompts == [0, 1, 2]


def test_dapo_settings_and_their_errors():
  s = settings.read(_config(algorithm="dapo"))
  assert (s.eps_low, s.eps_high, s.aggregation) == (0.2, 0.28, "token")
  assert s.algorithm.overlong_buffer == 16 // 5 and s.algorithm.dynamic_sampling_rounds == 10
  s = settings.read(_config(algorithm="grpo", **{"loss.overlong_buffer": 4,
                                                 "loss.sampler_correction": "token_mask"}))
  assert s.algorithm.overlong_buffer == 4 and s.recomputes_old_logp
  assert settings.read(_config(algorithm="grpo")).algorithm.dynamic_sampling_rounds == 0
  for overrides, message in [
      ({"loss.overlong_buffer": 16}, "loss.overlong_buffer=16 must be in 0..15"),
      ({"loss.sampler_correction": "tis"}, "loss.sampler_correction='tis': choose one of"),
      ({"loss.sampler_correction_cap": 0.0}, "loss.sampler_correction_cap=0.0 must be > 0"),
      ({"rollout.dtype": "int8"}, "rollout.dtype='int8': choose one of")]:
    with pytest.raises(ConfigError, match=message):
      settings.read(_config(algorithm="dapo", **overrides))
  with pytest.raises(ConfigError, match="needs rollout.samples_per_prompt >= 2, not 1"):
    settings.read(_config(algorithm="ppo", **{"loss.dynamic_sampling_rounds": 2,
                                              "rollout.samples_per_prompt": 1,
                                              "train.global_batch": 4,
                                              "train.micro_batch": 4}))


def _dapo(**overrides):
  return _config(algorithm="dapo", **{"scorer.source": "fake_scorer:make_binary",
                                      "train.num_steps": 2, "prompts.eval_limit": 2,
                                      "loss.dynamic_sampling_rounds": 3,
                                      "loss.track_kl": True, **overrides})


def test_dapo_end_to_end_drops_equal_groups_and_resumes(tmp_path):
  """A pass/fail reward: equal groups are replaced in extra rounds (the metrics say how
  many), and a run stopped after iteration 1 resumes to the uninterrupted one."""
  task.run(_dapo(), str(tmp_path / "straight"))
  rows = _train_rows(tmp_path / "straight")
  for row in rows.values():
    assert {"dynamic_rounds", "dynamic_drop_rate", "dynamic_filled"} <= set(row)
    assert 0 <= row["dynamic_drop_rate"] <= 1 and row["dynamic_rounds"] <= 3
  assert any(row["dynamic_rounds"] > 0 for row in rows.values()), rows
  assert rows[1]["kl"] == pytest.approx(0.0, abs=1e-4) and rows[2]["kl"] > 0  # track_kl
  config = _dapo(**{"train.num_steps": 1})
  task.run(config, str(tmp_path / "resumed"))
  config.train.num_steps = 2
  task.run(config, str(tmp_path / "resumed"))
  resumed = _train_rows(tmp_path / "resumed")
  for key in ("reward", "kl", "loss", "response_length", "dynamic_rounds",
              "dynamic_drop_rate", "grad_norm"):
    assert rows[2][key] == resumed[2][key], key


def test_bf16_rollouts_of_an_fp32_update_are_corrected(tmp_path):
  """The engine in bf16, the update in fp32: the mismatch is measured and the weights
  move off 1 (capped); with fp32 rollouts the gap is at rounding level."""
  def run(name, dtype):
    config = _config(algorithm="grpo", **{
        "train.num_steps": 2, "prompts.eval_limit": 2, "rollout.dtype": dtype,
        "loss.sampler_correction": "token_truncate", "loss.sampler_correction_cap": 1.0005})
    assert config.model.dtype == "float32"
    summary = task.run(config, str(tmp_path / name))
    assert summary["status"] == "finished"
    return _train_rows(tmp_path / name)

  bf16, fp32 = run("bf16", "bfloat16"), run("fp32", "")
  # The tiny random policy's distributions are nearly flat, so bf16's gap is small in
  # absolute terms; what is tested is its size against fp32's and the cap acting.
  for step, row in bf16.items():
    assert row["mismatch_abs_max"] > 1e-4 and 0 < row["is_capped"] < 0.5
    assert row["is_weight_max"] == pytest.approx(1.0005)
    assert row["mismatch_kl_k3"] > 1e4 * fp32[step]["mismatch_kl_k3"]
    assert row["sampler_logp_gap"] > 100 * fp32[step]["sampler_logp_gap"]
  for row in fp32.values():
    assert row["mismatch_abs_max"] < 1e-5 and row["is_capped"] == 0


def test_filter_truncated_keeps_cut_completions_out_of_the_loss():
  """DAPO's overlong filtering: the loss mask drops completions cut at the limit; the
  advantages of the others are unchanged."""
  algo = dataclasses.replace(DAPO().resolved(8), filter_truncated=True)
  mask = np.ones((4, 8), np.float32)
  mask[1, 5:] = mask[3, 2:] = 0
  finished = np.array([False, True, False, True])
  loss_mask = mask * finished[:, None]
  adv = algo.advantages({"mask": loss_mask}, np.array([1.0, 0.0, 2.0, 0.5], np.float32), 2,
                        None, None)
  assert not adv[0].any() and not adv[2].any() and adv[1, :5].all()
