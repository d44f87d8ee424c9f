"""SteerLM 2.0's loss against NeMo-Aligner's GPTSteerLMModel, re-derived in NumPy.

NeMo-Aligner (nemo_aligner/models/nlp/gpt/gpt_steerlm_model.py, SteerLM2Dataset in
nemo_aligner/data/nlp/datasets.py): the dataset computes ws = softmax(log P(a|x,y) +
log P(y|x) - log Q'(y|a,x)) per group; `get_loss_and_metrics` runs a forward-only pass
for the baseline b = softmax(-NLL - log Q'), sets weight = ws - b and
avg_num_valid_tokens_in_ub = mean(response tokens) / micro-batches per group; each
micro-batch's loss is sum(weight * NLL) / avg_num_valid_tokens_in_ub[0] and the step's
loss is the mean over all micro-batches. The distance is sum(ws' log(ws' / b')) with
1e-8 added to both.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.features import steerlm2_rows
from helpsteer_jax.data.formats import steerlm2 as fmt
from helpsteer_jax.data.records import Turn
from helpsteer_jax.losses import steerlm2
from helpsteer_jax.models import builder, catalog, hf


def _softmax(x):
  x = np.asarray(x, np.float64) - np.max(x)
  return np.exp(x) / np.exp(x).sum()


def nemo_loss(nll, log_q, ws, tokens, mbs):
  """NeMo-Aligner's loss and distance for groups [G, n], micro-batches of `mbs`."""
  g, n = nll.shape
  per_group_mb = n // mbs
  losses, distances = [], []
  for k in range(g):
    base = -nll[k] - log_q[k]
    base = _softmax(base)
    weight = ws[k] - base
    avg = tokens[k].mean() / per_group_mb
    for j in range(per_group_mb):
      sl = slice(j * mbs, (j + 1) * mbs)
      losses.append((weight[sl] * nll[k, sl]).sum() / avg)
    b, w = base + 1e-8, ws[k] + 1e-8
    distances.append(np.sum(w * np.log(w / b)))
  return float(np.mean(losses)), float(np.mean(distances))


@pytest.mark.parametrize("mbs", [1, 2, 4])
def test_group_loss_equals_nemo_aligner(mbs):
  rng = np.random.default_rng(0)
  g, n = 3, 4
  nll = rng.uniform(5, 60, (g, n))
  log_q = -rng.uniform(5, 60, (g, n))
  ws = np.stack([steerlm2_rows.importance_weights(rng.normal(size=n), -rng.uniform(5, 60, n),
                                                  log_q[k]) for k in range(g)])
  tokens = rng.integers(3, 40, (g, n)).astype(np.float64)
  want_loss, want_distance = nemo_loss(nll, log_q, ws, tokens, mbs)

  args = [jnp.asarray(a, jnp.float32) for a in (nll, log_q, ws, tokens)]
  total, sums = steerlm2.group_loss(*args, jnp.ones(g, jnp.float32))
  np.testing.assert_allclose(float(total) / float(sums["weight"]), want_loss, rtol=1e-5)
  np.testing.assert_allclose(float(sums["distance"]) / g, want_distance, rtol=1e-5, atol=1e-6)

  # The gradient is -(w - b) d log Q / mean tokens: b carries none.
  grad = np.asarray(jax.grad(lambda x: steerlm2.group_loss(x, *args[1:], jnp.ones(g))[0])(
      args[0]))
  for k in range(g):
    b = _softmax(-nll[k] - log_q[k])
    np.testing.assert_allclose(grad[k], (ws[k] - b) / tokens[k].mean(), rtol=1e-5, atol=1e-7)


def test_padding_groups_count_nothing():
  args = [jnp.ones((2, 3)), jnp.zeros((2, 3)), jnp.full((2, 3), 1 / 3), jnp.ones((2, 3))]
  total, sums = steerlm2.group_loss(*args, jnp.asarray([1.0, 0.0]))
  assert float(sums["weight"]) == 1.0
  np.testing.assert_allclose(float(total), 0.0, atol=1e-7)


def test_importance_weights_are_the_dataset_softmax():
  a, u, q = [0.5, -1.0, 2.0], [-30.0, -20.0, -25.0], [-28.0, -22.0, -26.0]
  np.testing.assert_allclose(steerlm2_rows.importance_weights(a, u, q),
                             _softmax(np.add(a, u) - q), rtol=1e-12)


def test_attribute_logprob_is_a_normal_over_the_labels():
  preds = np.zeros((2, 9))
  preds[0, 4], preds[0, 8], preds[1, 4] = 3.2, 0.7, 1.0
  requested = np.zeros((2, 9), np.int64)
  requested[:, 4], requested[:, 8] = 4, 1
  mask = np.zeros((2, 9))
  mask[:, [4, 8]] = 1
  got = steerlm2.attribute_logprob(preds, requested, mask, sigma=0.8)
  values = np.arange(5.0)

  def logp(r, a):
    d = np.exp(-(values - r) ** 2 / (2 * 0.8 ** 2))
    return np.log(d[a] / d.sum())
  np.testing.assert_allclose(got, [logp(3.2, 4) + logp(0.7, 1), logp(1.0, 4) + logp(0.0, 1)],
                             rtol=1e-12)


def _groups():
  def resp(text, q):
    return fmt.Response(text, -0.5, -20.0, q)
  turns = (Turn("User", "Name a fruit."),)
  return [fmt.Group(fmt.template.DEFAULT_SYSTEM, turns, "helpfulness:4,verbosity:1",
                    (resp("An apple.", -9.0), resp("Pears are fruit too.", -12.0),
                     resp("Banana", -7.0))),
          fmt.Group("Be brief.", turns + (Turn("Assistant", "Apple."), Turn("User", "Another?")),
                    "helpfulness:2", (resp("Plum.", -5.0), resp("A cherry, maybe.", -8.0),
                                      resp("", -6.5)))]  # an empty answer is a sample too


def test_model_loss_and_gradient_equal_the_full_softmax_reference(tmp_path):
  """The fused-projection loss on a tiny model equals NeMo's formula on the model's full
  logits (NumPy), and its gradient equals that of -sum (w - b) log Q / mean tokens
  computed with a plain log-softmax."""
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path / "tok"))
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  examples, kept, report = steerlm2_rows.group_examples(_groups(), tok, 64)
  assert kept == [0, 1], report.summary()
  batch = {k: jnp.asarray(np.stack([e[k] for e in examples])) for k in examples[0]}

  total, sums = steerlm2.steerlm2_loss(model, batch, chunk_size=16)
  logits = np.asarray(model.logits(model(batch["inputs"].reshape(6, 64),
                                         batch["positions"].reshape(6, 64),
                                         batch["segment_ids"].reshape(6, 64))), np.float64)
  logits -= logits.max(-1, keepdims=True)
  logsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  targets, weights = (np.asarray(batch[k]).reshape(6, 64) for k in ("targets", "weights"))
  nll = -np.array([(np.take_along_axis(logsm[i], targets[i][:, None], 1)[:, 0]
                    * weights[i]).sum() for i in range(6)]).reshape(2, 3)
  tokens = np.asarray(batch["weights"]).sum(-1)
  want, _ = nemo_loss(nll, np.asarray(batch["log_q"], np.float64),
                      np.asarray(batch["ws"], np.float64), tokens, mbs=1)
  np.testing.assert_allclose(float(total) / 2, want, rtol=1e-5)

  from flax import nnx
  graphdef, params = nnx.split(model)

  def fused(p):
    return steerlm2.steerlm2_loss(nnx.merge(graphdef, p), batch, chunk_size=16)[0]

  def plain(p):
    m = nnx.merge(graphdef, p)
    lg = m.logits(m(batch["inputs"].reshape(6, 64), batch["positions"].reshape(6, 64),
                    batch["segment_ids"].reshape(6, 64)))
    lp = jnp.take_along_axis(jax.nn.log_softmax(lg, -1),
                             batch["targets"].reshape(6, 64)[..., None], -1)[..., 0]
    logq = (lp * batch["weights"].reshape(6, 64)).sum(-1).reshape(2, 3)
    b = jax.nn.softmax(jax.lax.stop_gradient(logq) - batch["log_q"], -1)
    return -((batch["ws"] - b) * logq).sum(-1).dot(1 / batch["weights"].sum(-1).mean(-1))

  for a, b in zip(jax.tree.leaves(jax.grad(fused)(params)),
                  jax.tree.leaves(jax.grad(plain)(params))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_the_starting_model_s_baseline_is_uniform(tmp_path):
  """With log Q' from the model being trained, b is uniform: the first step's weights are
  w - 1/n (NeMo computes log Q' on the same tokens)."""
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path / "tok"))
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  examples, _, _ = steerlm2_rows.group_examples(_groups(), tok, 64)
  batch = {k: jnp.asarray(np.stack([e[k] for e in examples])) for k in examples[0]}
  nll = steerlm2.response_nll(model, batch, chunk_size=16)
  batch["log_q"] = -nll
  _, sums = steerlm2.steerlm2_loss(model, batch, chunk_size=16)
  np.testing.assert_allclose(float(sums["base_weight_max"]) / 2, 1 / 3, rtol=1e-5)


def test_groups_round_trip_and_bad_rows_name_their_line(tmp_path):
  from helpsteer_jax.errors import DataError
  path = tmp_path / "groups.jsonl"
  groups = _groups()
  fmt.write_groups(path, groups)
  back = fmt.read_groups(path)
  assert [fmt.group_row(g) for g in back] == [fmt.group_row(g) for g in groups]
  lines = path.read_text().splitlines()
  bad = fmt.group_row(groups[0])
  bad["responses"][1]["log(P(y|x))"] = "v2"
  path.write_text(lines[0] + "\n" + __import__("json").dumps(bad) + "\n")
  with pytest.raises(DataError, match=r"groups.jsonl.*2.*log\(P\(y\|x\)\)"):
    fmt.read_groups(path)
