"""Steerable generation (SteerLM inference).

Answers prompts from a file, stdin or the held-out demo prompts (or chats in
the terminal) with a model from an HF directory or a training checkpoint,
asking for the configured attribute values (by default the model's own
steerable attributes, from its export); optionally best-of-n with an
attribute model. Writes one jsonl row per prompt: prompt, attributes,
response (and, for best-of-n, every candidate with its scores and reward).

File mode appends each batch's rows as they are decoded; a rerun keeps the
complete rows already written (a torn last line is cut off), checks that
they answer this input, redoes the batch it stopped in with the same seed
and appends the rest, so the output equals an uninterrupted run. With
several processes, every batch is sharded over the mesh (each process's
devices decode their rows), and process 0 alone decides where to resume
and writes.
"""

from __future__ import annotations

import pathlib
import time
from typing import Sequence

import ml_collections
from absl import logging

from helpsteer_jax import multihost, processes, resume, runtime, weights
from helpsteer_jax.config_reads import Reads
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import best_of_n as best_of_n_lib
from helpsteer_jax.inference import chat as chat_lib
from helpsteer_jax.inference import sample_score, steering
from helpsteer_jax.inference.generator import Generator
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs.generation import build_generator, read_input, sampling_config
from helpsteer_jax.scoring import rewards
from helpsteer_jax.scoring.load import load_scorer, scorer_reads
from helpsteer_jax.scoring.scorer import Scorer

MODES = ("file", "chat")


def _answer_batch(generator: Generator, batch: list, config: ml_collections.ConfigDict,
                  sampling: SamplingConfig, seed: int, scorer, weights) -> list[dict]:
  """One output row per request of `batch`."""
  if scorer is not None:
    results = best_of_n_lib.best_of_n(generator, batch, config.best_of_n.n, scorer, weights,
                                      config.max_new_tokens, sampling, seed)
    return [req.output_row(result.response, best=result.best,
                           candidates=[vars(c) for c in result.candidates])
            for req, result in zip(batch, results)]
  completions = generator.complete([r.prompt_text() for r in batch], config.max_new_tokens,
                                   sampling=sampling, seed=seed)
  return [req.output_row(steering.response_text(c.text, c.finish_reason),
                         finish_reason=c.finish_reason) for req, c in zip(batch, completions)]


def config_reads() -> list:
  """The scorer is read for best-of-n alone; then its kind's keys."""
  return [Reads(("scorer",), "best_of_n.n", "above 1 (best-of-n)",
                lambda c: c.best_of_n.n > 1), *scorer_reads()]


def best_of_n_scorer(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                     requests: Sequence[steering.Request] = ()) -> Scorer | None:
  """The best-of-n scorer, `config.scorer`'s (None for n = 1). A generative judge whose
  budget has room for none of `requests` is refused before anything compiles (a request
  it has no room for keeps its first candidate: none is judged)."""
  if config.best_of_n.n < 2:
    return None
  scorer = load_scorer(config.scorer, rt)
  sample_score.judged(scorer, requests, "prompt")
  return scorer


def answer_all(generator: Generator, requests: list, config: ml_collections.ConfigDict,
               sampling: SamplingConfig, out_path: pathlib.Path, scorer=None) -> int:
  """Appends the answers not yet in `out_path`; returns how many rows were there already.

  Row i samples with seed `config.seed` + i (its batch's seed + its place in the
  batch), so a resumed run (which redoes the batch it stopped in) samples what an
  uninterrupted run would, whatever the batch size.
  `scorer` is `best_of_n_scorer`'s (needed for n > 1).
  """
  bon = config.best_of_n
  if scorer is None and bon.n > 1:
    raise ValueError("best-of-n needs a scorer: best_of_n_scorer(config, rt)")
  weights = rewards.weight_vector(config.scorer.weights.to_dict())
  per_batch = max(1, config.batch_size // bon.n)  # n rows per prompt in one batch
  return resume.append_batches(
      out_path, requests, steering.Request.matches, "--config.output", per_batch,
      lambda start, batch: _answer_batch(generator, batch, config, sampling,
                                         config.seed + start, scorer, weights))


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  workdir = pathlib.Path(workdir)
  if config.mode not in MODES:
    raise ConfigError(f"mode={config.mode!r}; choose one of {MODES}")
  if config.batch_size < 1 or config.best_of_n.n < 1:
    raise ConfigError("batch_size and best_of_n.n must be at least 1")
  sampling = sampling_config(config)
  if config.best_of_n.n > 1 and sampling.greedy:
    raise ConfigError(f"best_of_n.n={config.best_of_n.n} needs sampling: set"
                      " --config.sampling.temperature to a value > 0")
  attributes = steering.run_attributes(config, weights.steer_spec(config))
  requests = read_input(config, attributes) if config.mode == "file" else []
  setup = setup_lib.prepare(config, workdir, tokenizer=False, model=False)
  generator = build_generator(config, setup.rt, workdir)

  if config.mode == "chat":
    def respond(prompt: str) -> str:
      c = generator.complete([prompt], config.max_new_tokens, sampling, config.seed)[0]
      return steering.response_text(c.text, c.finish_reason)
    chat_lib.chat(respond, attributes, config.system)
    return {"mode": "chat"}

  out_path = pathlib.Path(config.output) if config.output else workdir / "generations.jsonl"
  out_path.parent.mkdir(parents=True, exist_ok=True)
  start = time.perf_counter()
  done = answer_all(generator, requests, config, sampling, out_path,
                    best_of_n_scorer(config, setup.rt, requests))
  seconds = time.perf_counter() - start
  logging.info("compiled decode variants: %d", generator.engine.compiled_variants)
  multihost.report_split("generate: rows decoded", generator.engine.local_rows)
  if processes.is_primary():
    print(f"generate: answered {len(requests) - done} prompts in {seconds:.1f}s"
          f" ({done} already answered) -> {out_path}")
  return {"mode": "file", "prompts": len(requests), "already_written": done,
          "output": str(out_path), "seconds": seconds}
