"""Chunked prefill: newcomers' prompts ride on the running rows' decode steps.

Reference: each request decoded alone by the same engine (nothing else decoding, so its
prompt is prefilled whole, as before chunked prefill existed). In a crowd larger than
the rows, freed rows take newcomers whose prompts are prefilled `prefill_chunk` tokens per
step within the others' steps (rows in both blocks of rows, prompts of one or several
chunks, longer prompts falling back to a whole prefill); every request must get the
tokens it gets alone, greedy or sampled with its seed, with the same log-probabilities,
and nothing may compile after warm-up. Gemma 2's knobs (a sliding window shorter than
the prompts, soft-capping) check the chunk's masks.
"""

import jax
import numpy as np
import pytest

from helpsteer_jax import sharding
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import engine as engine_lib
from helpsteer_jax.inference import generator, prefill_chunks
from helpsteer_jax.models import builder, catalog, families, hf

GEMMA2 = dict(families.get("gemma2").config_fields(), num_layers=3, sliding_window=4,
              layer_types=("sliding_attention", "full_attention"), attn_logit_softcap=5.0,
              final_logit_softcap=10.0, query_pre_attn_scalar=16, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path_factory.mktemp("tok")))


def _engine(tokenizer, family=None, data=1, **kw):
  cfg = catalog.model_config("tiny", **(family or {}), initializer_range=0.1)
  mesh = sharding.make_mesh((data, 1, 1), jax.devices()[:data])
  model = builder.materialize(lambda: builder.new_model(cfg, 0), mesh, sharding.DEFAULT_RULES)
  return generator.make_engine(model, mesh, tokenizer, max_length=96, stop_strings=(), **kw)


def _requests(n: int) -> list[engine_lib.DecodeRequest]:
  """Prompts of 3 to 41 tokens (one to six chunks of 8), budgets of 2 to 13 tokens; every
  third request sampled with its own seed."""
  rng = np.random.default_rng(0)
  out = []
  for i in range(n):
    ids = rng.integers(5, 200, size=int(rng.integers(3, 42))).tolist()
    sampled = i % 3 == 2
    out.append(engine_lib.DecodeRequest(
        prompt_ids=ids, max_tokens=int(rng.integers(2, 14)),
        temperature=0.9 if sampled else 0.0, top_p=0.95 if sampled else 1.0, seed=i))
  return out


@pytest.mark.parametrize("family", [None, GEMMA2], ids=["llama", "gemma2"])
def test_a_crowd_with_chunked_newcomers_equals_each_request_alone(tokenizer, family):
  eng = _engine(tokenizer, family, max_batch=32, chunk_steps=4, prefill_chunk=8)
  assert eng.mixed_buckets == [16, 32]
  eng.warm_up()
  compiled = eng.compiled_variants
  assert compiled == eng.warm_up_programs  # what the warm-up counted up front
  joined = []
  plan = eng._plan

  def recording_plan():
    steps, joins = plan()
    joined.extend(joins)
    return steps, joins

  eng._plan = recording_plan
  requests = _requests(48)
  crowd = eng.generate(requests)
  assert eng.stats["prefill_chunks"] > 0
  assert min(joined) < 16 <= max(joined)  # newcomers chunk-prefilled in both blocks
  assert eng.compiled_variants == compiled  # the warm-up compiled every mixed step
  for i, (req, got) in enumerate(zip(requests, crowd)):
    [alone] = eng.generate([req])
    assert got.token_ids == alone.token_ids, i
    np.testing.assert_allclose(got.logprobs, alone.logprobs, atol=2e-5, err_msg=str(i))
    np.testing.assert_allclose(got.raw.chosen, alone.raw.chosen, atol=2e-5, err_msg=str(i))
  assert eng.compiled_variants == compiled


def test_chunked_newcomers_on_a_batch_sharded_cache_equal_each_request_alone(tokenizer):
  """Rows split over two batch shards (one block of every row, decoded whole): a chunk's
  row lives on either shard."""
  eng = _engine(tokenizer, data=2, max_batch=8, chunk_steps=4, prefill_chunk=8)
  assert eng.batch_shards == 2 and eng.mixed_buckets == [8]
  requests = [r for r in _requests(24) if len(r.prompt_ids) <= 32][:14]
  crowd = eng.generate(requests)
  assert eng.stats["prefill_chunks"] > 0
  for i, (req, got) in enumerate(zip(requests, crowd)):
    [alone] = eng.generate([req])
    assert got.token_ids == alone.token_ids, i


def test_prefill_chunk_settings_are_checked(tokenizer):
  with pytest.raises(ConfigError, match="at least chunk_steps"):
    _engine(tokenizer, max_batch=4, chunk_steps=8, prefill_chunk=4)
  off = _engine(tokenizer, max_batch=4, chunk_steps=8, prefill_chunk=0)
  assert off.mixed_buckets == []
  out = off.generate(_requests(6))
  assert off.stats["prefill_chunks"] == 0 and all(o.token_ids for o in out)


def test_a_rounds_plan_takes_prompts_in_order_and_places_them_where_their_rows_join():
  plan = prefill_chunks.ChunkPlan(chunk=8, chunk_steps=4, max_length=96)
  assert [plan.count(n) for n in (1, 8, 9, 32, 33)] == [1, 1, 2, 4, None]
  # 2 + 1 chunks fit the round; the next prompt (2 chunks) waits for the next one.
  assert plan.joins({5: 10, 2: 3, 7: 12}) == {5: 2, 2: 3}
  assert plan.min_end([10, 3]) == 16
  chunks = plan.chunks(list(range(100, 110)), row=5, join=2, end=40, pad_id=0)
  assert sorted(chunks) == [0, 1]
  first, last = chunks[0], chunks[1]
  # ten tokens left-padded to 16: they end right before slot end + join = 42
  assert first.slot == 26 and last.slot == 34 and first.row_start == last.row_start == 32
  assert first.tokens.tolist() == [0] * 6 + [100, 101] and last.tokens.tolist() == list(
      range(102, 110))
  assert first.positions.tolist() == [0] * 7 + [1] and last.positions.tolist() == list(
      range(2, 10))
  assert (first.last, last.last, int(first.row)) == (0, 1, 5)
  # the row's own decode writes before it joins (slots 40, 41) lie in its last chunk
  assert last.slot <= 40 and 41 < last.slot + 8
