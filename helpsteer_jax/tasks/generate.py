"""Steerable generation (SteerLM inference).

Answers prompts from a file, stdin or the held-out demo prompts (or chats in
the terminal) with a model from an HF directory or a training checkpoint,
asking for the configured attribute values; optionally best-of-n with an
attribute model. Writes one jsonl row per prompt: prompt, attributes,
response (and, for best-of-n, every candidate with its scores and reward).
"""

from __future__ import annotations

import io
import json
import pathlib
import time

import jax
import ml_collections
from absl import logging

from helpsteer_jax import runtime
from helpsteer_jax.data import demo
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import best_of_n as best_of_n_lib
from helpsteer_jax.inference import chat as chat_lib
from helpsteer_jax.inference import loading, steering
from helpsteer_jax.inference.decode import Decoder
from helpsteer_jax.inference.generator import Generator
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.models import hf

MODES = ("file", "chat")


def sampling_config(config: ml_collections.ConfigDict) -> SamplingConfig:
  s = config.sampling
  return SamplingConfig(temperature=float(s.temperature), top_k=int(s.top_k),
                        top_p=float(s.top_p))


def read_input(config: ml_collections.ConfigDict, attributes: dict[str, int]) -> list:
  """Requests from `config.input`, or the 50 held-out demo prompts when it is empty."""
  if config.input:
    return steering.read_requests(config.input, attributes, config.system)
  return [steering.make_request(p, attributes, config.system) for p in demo.heldout_prompts()]


def build_generator(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                    workdir: pathlib.Path) -> Generator:
  tokenizer = hf.load_tokenizer(loading.tokenizer_dir(config, workdir))
  model = loading.load_model(config, rt)
  runtime.check_tokenizer_fits(tokenizer, model.cfg.vocab_size, "use the training run's tokenizer")
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  # Files decode full batches (one compile); chat decodes one conversation.
  min_batch = config.batch_size if config.mode == "file" else 1
  decoder = Decoder(model, rt.mesh, rt.rules, max_length=config.max_length or None,
                    pad_id=pad, min_batch=min_batch)
  return Generator(decoder, tokenizer, tuple(config.stop_strings), add_bos=config.add_bos)


def _answer_all(generator: Generator, requests: list, config: ml_collections.ConfigDict,
                sampling: SamplingConfig, out_file) -> None:
  bon = config.best_of_n
  if bon.n > 1:
    scorer = best_of_n_lib.load_scorer(bon.scorer, bon.scorer_path)
    weights = best_of_n_lib.weight_vector(bon.weights.to_dict())
    per_batch = max(1, config.batch_size // bon.n)  # n rows per prompt in one batch
    for start in range(0, len(requests), per_batch):
      batch = requests[start: start + per_batch]
      results = best_of_n_lib.best_of_n(generator, batch, bon.n, scorer, weights,
                                        config.max_new_tokens, sampling, config.seed + start)
      for req, result in zip(batch, results):
        row = req.output_row(result.response, best=result.best,
                             candidates=[vars(c) for c in result.candidates])
        out_file.write(json.dumps(row) + "\n")
      out_file.flush()
    return
  for start in range(0, len(requests), config.batch_size):
    batch = requests[start: start + config.batch_size]
    completions = generator.complete([r.prompt_text() for r in batch], config.max_new_tokens,
                                     sampling=sampling, seed=config.seed + start)
    for req, c in zip(batch, completions):
      row = req.output_row(steering.response_text(c.text, c.finish_reason),
                           finish_reason=c.finish_reason)
      out_file.write(json.dumps(row) + "\n")
    out_file.flush()


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
  attributes = steering.run_attributes(config)
  requests = read_input(config, attributes) if config.mode == "file" else []
  runtime.check_workdir(workdir)
  rt = runtime.setup(config)
  generator = build_generator(config, rt, workdir)

  if config.mode == "chat":
    def respond(prompt: str) -> str:
      c = generator.complete([prompt], config.max_new_tokens, sampling, config.seed)[0]
      return steering.response_text(c.text, c.finish_reason)
    chat_lib.chat(respond, attributes, config.system)
    return {"mode": "chat"}

  out_path = pathlib.Path(config.output) if config.output else workdir / "generations.jsonl"
  out_path.parent.mkdir(parents=True, exist_ok=True)
  start = time.perf_counter()
  # Every process decodes (the step is collective); process 0 writes.
  sink = open(out_path, "w", encoding="utf-8") if jax.process_index() == 0 else io.StringIO()
  with sink as f:
    _answer_all(generator, requests, config, sampling, f)
  seconds = time.perf_counter() - start
  logging.info("compiled decode variants: %d", generator.decoder.compiled_variants)
  print(f"generate: answered {len(requests)} prompts in {seconds:.1f}s -> {out_path}")
  return {"mode": "file", "prompts": len(requests), "output": str(out_path), "seconds": seconds}
