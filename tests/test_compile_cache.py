"""JAX's persistent compilation cache in the workdir (`compile_cache.py`).

An engine warmed up twice in one process with the cache directory set: the
first warm-up compiles every program and writes it there; the second (a new
engine, whose functions JAX has never traced, as after a restart) reads every
program it compiles from the cache, as JAX's monitoring events count them, and decodes
the same greedy tokens.
"""

import pathlib

import jax
import ml_collections
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from helpsteer_jax import compile_cache, config_base, sharding
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.inference import generator
from helpsteer_jax.models import builder, catalog, hf

COUNTER = compile_cache.CompileCounter()


@pytest.fixture
def restore_jax_cache():
  """JAX's cache settings as they were before the test (other tests compile after it)."""
  before = (jax.config.jax_compilation_cache_dir,
            jax.config.jax_persistent_cache_min_compile_time_secs,
            jax.config.jax_persistent_cache_min_entry_size_bytes)
  yield
  jax_cache.reset_cache()
  for name, value in zip(("jax_compilation_cache_dir",
                          "jax_persistent_cache_min_compile_time_secs",
                          "jax_persistent_cache_min_entry_size_bytes"), before):
    jax.config.update(name, value)


def _config(directory: str, min_compile_secs: float = 0.0) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict({"compile_cache": config_base.compile_cache_section(
      directory)})
  config.compile_cache.min_compile_secs = min_compile_secs
  return config


def test_the_setting_names_the_directory(tmp_path, restore_jax_cache):
  assert compile_cache.resolve("", tmp_path) is None
  assert compile_cache.resolve("workdir", tmp_path) == tmp_path / "compile_cache"
  assert compile_cache.resolve(str(tmp_path / "elsewhere"), "wd") == tmp_path / "elsewhere"
  # Off leaves JAX's own settings (e.g. $JAX_COMPILATION_CACHE_DIR) alone.
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "users"))
  assert compile_cache.configure(_config(""), tmp_path) is None
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "users")
  path = compile_cache.configure(_config("workdir", 0.5), tmp_path)
  assert path == tmp_path / "compile_cache" and path.is_dir()
  assert jax.config.jax_compilation_cache_dir == str(path)
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.5
  assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
  # The serve task keeps it in its workdir; other tasks leave it off unless asked.
  from helpsteer_jax import task_configs
  serve = task_configs.load(task_configs.resolve("serve"))["get_config"]()
  assert serve.compile_cache.dir == "workdir"
  assert config_base.base_config("acsft").compile_cache.dir == ""


def _engine(model, tok):
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  return generator.make_engine(model, mesh, tok, max_batch=2, max_length=48, chunk_steps=4)


def _warm(model, tok) -> tuple[compile_cache.Counts, list[int]]:
  """A new engine's warm-up (its compiles and cache hits) and its greedy tokens."""
  before = COUNTER.snapshot()
  engine = _engine(model, tok)
  engine.warm_up()
  after = COUNTER.snapshot()
  out = generator.Generator(engine).complete(["Name a colour"], 6)[0]
  seconds = {k: after.seconds[k] - before.seconds[k] for k in after.seconds}
  return compile_cache.Counts(after.compiles - before.compiles,
                              after.cache_hits - before.cache_hits, seconds), list(out.token_ids)


def test_a_second_warm_up_reads_every_program_from_the_cache(tmp_path, restore_jax_cache):
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path / "tok"))
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  cache = compile_cache.configure(_config("workdir"), tmp_path)
  first, tokens = _warm(model, tok)
  assert first.compiles > 0 and first.cache_hits == 0, first
  assert set(first.seconds) == {"trace", "lower", "compile"}
  assert all(t > 0 for t in first.seconds.values()), first
  entries = {p.name for p in pathlib.Path(cache).iterdir()}
  assert len(entries) >= first.compiles, (len(entries), first)
  second, again = _warm(model, tok)
  # (Fewer than the first: programs of module-level functions stay compiled in memory.)
  assert 0 < second.compiles <= first.compiles, (first, second)
  assert second.cache_hits == second.compiles and second.compiled_here == 0, second
  assert again == tokens
  # Reading a program is faster than compiling it.
  assert second.seconds["compile"] < first.seconds["compile"], (first, second)
