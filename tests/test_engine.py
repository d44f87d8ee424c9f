"""The engine: streaming requests, its batch API, log-probs, compiles.

References: each prompt decoded alone by another engine's batch API (what
configs/generate.py runs), and the model's full forward (log-softmax in
NumPy). Concurrent requests of different lengths, joining at chunk boundaries
and re-basing the cache, must give each prompt exactly the greedy text it
gets alone, with no compile after warm-up. transformers' `generate` is the
outside reference in tests/test_decode.py.
"""

import queue

import jax
import numpy as np
import pytest

from helpsteer_jax import sharding
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.inference import engine as engine_lib
from helpsteer_jax.inference import engine_steps, generator, steering
from helpsteer_jax.inference import sampling as sampling_lib
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.serve.backend import CompileCounter

pytestmark = pytest.mark.version_tier

PROMPTS = [("What is 2 plus 3?", 2), ("Name a colour", 4),
           ("Tell me a long story about dragons, castles and a very old wizard", 0), ("hi", 1)]


# Programs compiled or read from the persistent compilation cache (the tests share one).
COMPILES = CompileCounter()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path_factory.mktemp("tok")))
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  gen = generator.Generator(generator.make_engine(model, mesh, tok, max_batch=1,
                                                  max_length=96))
  eng = generator.make_engine(model, mesh, tok, max_batch=4, max_length=96, chunk_steps=8)
  eng.warm_up()
  eng.start()
  yield gen, eng
  eng.stop()


def _prompt(text: str, verbosity: int) -> str:
  return steering.make_request(text, {"verbosity": verbosity}).prompt_text()


def _run(eng, requests: list[dict]) -> list[tuple[engine_lib.Update, str]]:
  """Submits all at once; (final update, streamed deltas joined) per request."""
  queues = []
  for r in requests:
    q = queue.Queue()
    eng.submit(engine_lib.DecodeRequest(on_update=q.put, **r))
    queues.append(q)
  out = []
  for q in queues:
    deltas = []
    while True:
      u = q.get(timeout=300)
      deltas.append(u.delta)
      if u.finish_reason:
        break
    out.append((u, "".join(deltas)))
  return out


def test_concurrent_greedy_equals_each_prompt_alone_and_compiles_nothing(setup):
  gen, eng = setup
  prompts = [_prompt(*p) for p in PROMPTS]
  # More requests than rows, each budget different: rows free and refill at
  # chunk boundaries, and the 96-slot cache re-bases several times.
  budgets = [24, 9, 17, 30, 5, 24, 12, 20, 1, 16, 8, 24]
  refs = [gen.complete([prompts[i % 4]], b)[0] for i, b in enumerate(budgets)]
  compiled, compiles = eng.compiled_variants, COMPILES.count
  requests = [dict(prompt_ids=gen.encode(prompts[i % 4]), max_tokens=b)
              for i, b in enumerate(budgets)]
  results = _run(eng, requests)
  for i, (ref, (update, streamed)) in enumerate(zip(refs, results)):
    assert update.text == ref.text and update.finish_reason == ref.finish_reason, i
    assert update.completion_tokens == len(ref.token_ids)
    assert streamed == update.text
  assert eng.stats["rebases"] > 0
  # Rows that freed up took newcomers whose prompts rode on the others' decode steps.
  assert eng.stats["prefill_chunks"] > 0
  # Sampled and top-p rows alongside greedy ones: the same compiled functions.
  _run(eng, [dict(prompt_ids=gen.encode(prompts[0]), max_tokens=10, temperature=0.8,
                  top_p=0.9, seed=3),
             dict(prompt_ids=gen.encode(prompts[2]), max_tokens=10)])
  # The warm-up compiled what it counts up front (its progress bar's total), and the
  # requests compiled nothing more.
  assert eng.compiled_variants == compiled == eng.warm_up_programs
  assert COMPILES.count == compiles


def test_seeded_sampling_repeats_and_seeds_differ(setup):
  gen, eng = setup
  ids = gen.encode(_prompt(*PROMPTS[1]))
  req = dict(prompt_ids=ids, max_tokens=12, temperature=1.0, seed=7)
  first, second, other = _run(eng, [req, req, {**req, "seed": 8}])
  assert first[0].text == second[0].text
  assert first[0].text != other[0].text


def test_sample_rows_matches_the_static_sampler():
  logits = jax.random.normal(jax.random.key(0), (3, 50)) * 3
  keys = jax.vmap(jax.random.key)(np.arange(3, dtype=np.uint32))
  greedy, _ = sampling_lib.sample_rows(logits, keys, np.zeros(3, np.float32),
                                      np.ones(3, np.float32))
  np.testing.assert_array_equal(greedy, np.argmax(logits, -1))
  # One row sampled with top-p: the same draw as the static-config sampler.
  config = sampling_lib.SamplingConfig(temperature=0.7, top_p=0.5)
  mixed, _ = sampling_lib.sample_rows(logits, keys, np.asarray([0.0, 0.7, 0.0], np.float32),
                                   np.asarray([1.0, 0.5, 1.0], np.float32))
  alone = sampling_lib.categorical(keys[1:2],
                                  sampling_lib.filter_logits(logits[1:2], config))
  assert int(mixed[1]) == int(alone[0])
  assert int(mixed[0]) == int(greedy[0]) and int(mixed[2]) == int(greedy[2])


def test_cancel_frees_the_row_and_bad_sizes_are_refused(setup):
  gen, eng = setup
  ids = gen.encode(_prompt(*PROMPTS[0]))
  q = queue.Queue()
  handle = eng.submit(engine_lib.DecodeRequest(ids, 40, q.put))
  q.get(timeout=300)
  handle.cancel()
  (update, _), = _run(eng, [dict(prompt_ids=ids, max_tokens=3)])
  assert update.finish_reason == "length"
  assert eng.busy_rows == 0
  with pytest.raises(ValueError, match="exceeds the context length 96"):
    eng.submit(engine_lib.DecodeRequest(ids, 96, q.put))
  with pytest.raises(ValueError, match="empty"):
    eng.submit(engine_lib.DecodeRequest([], 4, q.put))


def _log_softmax(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def batch_engine(setup):
  """An engine driven by its batch API (no scheduler thread), 32 rows in two blocks."""
  gen, _ = setup
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  eng = generator.make_engine(model, mesh, gen.tokenizer, max_batch=32, max_length=96)
  assert eng.row_block == 16 and eng.row_buckets == [1, 4, 16, 32]
  return model, eng


def test_batch_api_equals_the_streaming_engine_and_its_logprobs_are_the_models(
    setup, batch_engine):
  gen, streaming = setup
  model, eng = batch_engine
  prompts = [gen.encode(_prompt(*p)) for p in PROMPTS]
  requests = [dict(prompt_ids=ids, max_tokens=20) for ids in prompts]
  outputs = eng.generate([engine_lib.DecodeRequest(**r) for r in requests])
  for out, (update, _) in zip(outputs, _run(streaming, requests)):
    assert out.text == update.text and out.finish_reason == update.finish_reason
    assert len(out.token_ids) == len(out.logprobs) == update.completion_tokens

  # Reference: the full forward over prompt + completion, log-softmax in NumPy.
  hot = dict(temperature=0.7, top_k=5, seed=11)
  sampled = eng.generate([engine_lib.DecodeRequest(prompt_ids=prompts[2], max_tokens=12,
                                                   **hot)])[0]
  for out, settings in [(outputs[0], {}), (outputs[2], {}), (sampled, hot)]:
    ids = (prompts[0] if out is outputs[0] else prompts[2]) + out.token_ids
    tokens = np.asarray([ids], np.int32)
    positions = np.arange(len(ids), dtype=np.int32)[None]
    logits = np.asarray(model.logits(model(tokens, positions, np.ones_like(tokens))))[0]
    start = len(ids) - len(out.token_ids) - 1
    rows = logits[start:start + len(out.token_ids)]
    if settings:
      rows = rows / settings["temperature"]
      kth = -np.sort(-rows, -1)[:, settings["top_k"] - 1:settings["top_k"]]
      rows = np.where(rows >= kth, rows, -np.inf)
    want = _log_softmax(rows)[np.arange(len(out.token_ids)), out.token_ids]
    np.testing.assert_allclose(out.logprobs, want, atol=2e-5)
    if not settings:
      np.testing.assert_array_equal(out.token_ids, rows.argmax(-1))


def _reference_logprobs(model, ids: list[int]) -> np.ndarray:
  """NumPy log_softmax of the full forward's logits over `ids`: [len(ids), vocab]."""
  tokens = np.asarray([ids], np.int32)
  positions = np.arange(len(ids), dtype=np.int32)[None]
  return _log_softmax(np.asarray(model.logits(model(tokens, positions, np.ones_like(tokens))))[0])


def _check_raw(raw: engine_lib.TokenLogprobs, ids: list[int], want: np.ndarray) -> None:
  """`raw` of `ids` against the reference rows `want` [len(ids), vocab]."""
  k = sampling_lib.MAX_LOGPROBS
  np.testing.assert_allclose(raw.chosen, want[np.arange(len(ids)), ids], atol=1e-5)
  np.testing.assert_allclose(raw.top, -np.sort(-want, -1)[:, :k], atol=1e-5)
  np.testing.assert_allclose(np.take_along_axis(want, raw.top_ids, -1), raw.top, atol=1e-5)


def test_raw_logprobs_and_prompt_scores_are_the_models(setup, batch_engine):
  gen, streaming = setup
  model, eng = batch_engine
  prompt = gen.encode(_prompt(*PROMPTS[2]))
  # A sampled row's raw log-probabilities are the model's, not the sampling distribution's.
  for settings in ({}, dict(temperature=0.7, top_p=0.8, seed=5)):
    out = eng.generate([engine_lib.DecodeRequest(prompt_ids=prompt, max_tokens=14,
                                                 **settings)])[0]
    want = _reference_logprobs(model, prompt + out.token_ids)[len(prompt) - 1:-1]
    _check_raw(out.raw, out.token_ids, want)
    assert out.raw.top_ids.shape == (len(out.token_ids), sampling_lib.MAX_LOGPROBS)
  # Scoring a prompt: each token after the first given the ones before, from either the
  # calling thread or the running scheduler, compiling nothing.
  want = _reference_logprobs(model, prompt)[:-1]
  compiles = COMPILES.count
  _check_raw(streaming.score(prompt).result(timeout=300), prompt[1:], want)
  assert COMPILES.count == compiles
  _check_raw(eng.score(prompt).result(), prompt[1:], want)
  assert len(eng.score(prompt[:1]).result().chosen) == 0
  with pytest.raises(ValueError, match="1..96"):
    eng.score([1] * 97)


def test_greedy_is_the_same_alone_and_among_15_or_20_others(setup, batch_engine):
  """Among 15 others a row decodes in one block of rows; among 20, the rows span two
  blocks (one step updates both in place) and the prompt sits in the second."""
  gen, _ = setup
  _, eng = batch_engine
  prompts = [gen.encode(_prompt(*PROMPTS[i % 4])) for i in range(16)]
  others = [gen.encode(f"Question {i}: " + _prompt(*PROMPTS[(i + 1) % 4])) for i in range(20)]
  for i, crowd_size in [(0, 15), (1, 15), (2, 20), (3, 20)]:
    at = i if crowd_size == 15 else 18
    alone = eng.generate([engine_lib.DecodeRequest(prompt_ids=prompts[i], max_tokens=12)])[0]
    crowd = eng.generate([engine_lib.DecodeRequest(prompt_ids=p, max_tokens=12)
                          for p in others[:at] + [prompts[i]] + others[at:crowd_size]])[at]
    assert crowd.token_ids == alone.token_ids, i


def test_row_buckets_hold_whole_blocks_and_bf16_on_cpu_starts_at_two_rows():
  assert engine_steps.row_block(64) == 16 and engine_steps.row_block(24) == 24
  assert engine_steps.row_block(64, batch_shards=2) == 64
  assert engine_steps.row_buckets(64, 16) == [1, 4, 16, 64]
  assert engine_steps.row_buckets(64, 16, first=2) == [2, 8, 16, 64]
  assert engine_steps.row_buckets(128, 16) == [1, 4, 16, 64, 128]
  assert engine_steps.row_buckets(24) == [1, 4, 16, 24]
  assert engine_steps.row_buckets(1, first=2) == [1]
  assert engine_steps.fewest_rows("bfloat16", "cpu") == 2
  assert engine_steps.fewest_rows("bfloat16", "tpu") == engine_steps.fewest_rows(
      "float32", "cpu") == 1


def test_load_weights_decodes_with_the_new_weights_and_compiles_nothing(setup):
  # Reference: an engine built on the new weights. The online-RL policy is reloaded
  # after every update, so loading must not recompile.
  gen, _ = setup
  tok = gen.engine.tokenizer
  mesh = gen.engine.mesh
  first = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  second = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=1)
  ids = gen.encode(_prompt(*PROMPTS[0]))
  request = [engine_lib.DecodeRequest(ids, 12)]
  eng = generator.make_engine(first, mesh, tok, max_batch=1, max_length=64)
  eng.warm_up()
  compiles = COMPILES.count
  before = eng.generate(request)[0].token_ids
  eng.load_weights(second)
  loaded = eng.generate(request)[0].token_ids
  assert COMPILES.count == compiles
  want = generator.make_engine(second, mesh, tok, max_batch=1, max_length=64).generate(request)
  assert loaded == want[0].token_ids != before
  eng.load_weights(first)
  assert eng.generate(request)[0].token_ids == before
  with pytest.raises(ValueError, match="differ in shape"):
    eng.load_weights(builder.create(catalog.model_config("tiny", num_layers=1), seed=0))
