"""Text in, text out on the engine: the tasks' prompts, stop ids and batch calls.

Every generating task (generate, best-of-n, steering sweeps, MT-Bench
answers) and the server build their `Engine` with `make_engine`: the
tokenizer's and the model's EOS ids and the stop strings that are one token
(the SteerLM turn marker `<extra_id_1>` in NeMo's and the demo tokenizers)
end a row inside the engine; longer stop strings end it when its text holds
one (`row_stream`). Either way the text is cut at the first stop string, so
the returned text never contains it, nor an EOS token.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
from flax import nnx

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.config_sections import DEFAULT_STOP_STRINGS
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.engine import DecodeRequest, Engine, Output
from helpsteer_jax.inference.sampling import SamplingConfig, sample_seed


def _ids(tokenizer: Any, text: str) -> list[int]:
  return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_ids(tokenizer: Any, stop_strings: Sequence[str],
             eos_ids: Sequence[int] = ()) -> tuple[int, ...]:
  """The EOS ids and the ids of the stop strings that are one token (alone, or after a
  newline, as tokenizers such as SentencePiece split them differently in context)."""
  ids = set(int(i) for i in eos_ids)
  newline = _ids(tokenizer, "\n")
  for s in stop_strings:
    variants = [_ids(tokenizer, s)]
    in_context = _ids(tokenizer, "\n" + s)
    if in_context[: len(newline)] == newline:
      variants.append(in_context[len(newline):])
    ids.update(int(v[0]) for v in variants if len(v) == 1)
  return tuple(sorted(ids))


def eos_ids(tokenizer: Any, model_eos: int | Sequence[int] | None) -> tuple[int, ...]:
  """The tokenizer's EOS id and the model config's EOS id(s)."""
  found = set()
  if getattr(tokenizer, "eos_token_id", None) is not None:
    found.add(int(tokenizer.eos_token_id))
  if model_eos is not None:
    found.update(int(i) for i in ((model_eos,) if isinstance(model_eos, int) else model_eos))
  return tuple(sorted(found))


def make_engine(model: nnx.Module, mesh: jax.sharding.Mesh, tokenizer: Any, *,
                rules: sharding_lib.Rules = sharding_lib.DEFAULT_RULES, max_batch: int = 16,
                max_length: int | None = None, chunk_steps: int = 8, pad_id: int = 0,
                stop_strings: Sequence[str] = DEFAULT_STOP_STRINGS,
                prefill_chunk: int = 64) -> Engine:
  """An `Engine` for `model` that ends rows at EOS and at `stop_strings`.

  `max_length` defaults to the model's `max_position_embeddings`; `max_batch`
  is rounded up to a multiple of the mesh's batch shards.
  """
  eos = eos_ids(tokenizer, model.cfg.eos_token_id)
  shards = sharding_lib.spec_shard_count(
      sharding_lib.logical_to_spec(("batch",), rules), mesh, 0)
  return Engine(model, mesh, tokenizer, rules=rules, max_batch=-(-max_batch // shards) * shards,
                max_length=max_length or model.cfg.max_position_embeddings,
                chunk_steps=chunk_steps, pad_id=pad_id,
                stop_ids=stop_ids(tokenizer, stop_strings, eos), eos_ids=eos,
                stop_strings=stop_strings, prefill_chunk=prefill_chunk)


class Generator:
  """Completes text prompts with an `Engine`'s batch API."""

  def __init__(self, engine: Engine, add_bos: bool = True):
    self.engine, self.tokenizer = engine, engine.tokenizer
    self.add_bos = add_bos

  def encode(self, prompt: str) -> list[int]:
    """Prompt ids exactly as AC-SFT training tokenizes text (`steering.encode_prompt`)."""
    return steering.encode_prompt(prompt, self.tokenizer, self.add_bos)

  def prompt_ids(self, prompt: str, i: int, max_new_tokens: int) -> list[int]:
    """Prompt `i`'s ids, checked to leave `max_new_tokens` in the KV cache."""
    if not prompt:
      raise ConfigError(f"prompt {i} is empty: give some text to continue")
    ids = self.encode(prompt)
    if len(ids) + max_new_tokens > self.engine.max_length:
      raise ConfigError(
          f"prompt {i} has {len(ids)} tokens; with max_new_tokens={max_new_tokens} that"
          f" exceeds the KV cache length {self.engine.max_length}: shorten the prompt,"
          " lower max_new_tokens or raise max_length (at most the model's"
          f" max_position_embeddings={self.engine.cfg.max_position_embeddings})")
    return ids

  def complete(self, prompts: Sequence[str], max_new_tokens: int,
               sampling: SamplingConfig = SamplingConfig(), seed: int = 0) -> list[Output]:
    """One completion per prompt; prompt i samples with `sample_seed(seed + i)`, so a
    row's output depends on its prompt and `seed` + its index alone (a batch passes the
    run's seed + its first row), not on the rest of the batch."""
    requests = [DecodeRequest(self.prompt_ids(p, i, max_new_tokens), max_new_tokens,
                              temperature=sampling.temperature, top_p=sampling.top_p,
                              top_k=sampling.top_k, seed=sample_seed(seed + i))
                for i, p in enumerate(prompts)]
    return self.engine.generate(requests)
