"""What the server runs: the policy's engine, its default attributes, the attribute model.

The policy loads as configs/generate.py loads it (`load.model`: an HF
directory or any training task's Orbax run as `init.source`), the attribute model as
every task loads one (`scoring.load.load_scorer` of `config.scorer`).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Callable

import ml_collections
import numpy as np
from absl import logging

from helpsteer_jax import runtime, weights
from helpsteer_jax.compile_cache import CompileCounter as CompileCounter  # the server's
from helpsteer_jax.data.records import Conversation
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.engine import Engine
from helpsteer_jax.inference.generator import make_engine
from helpsteer_jax.load import model as loader
from helpsteer_jax.scoring import rewards
from helpsteer_jax.scoring.load import load_scorer
from helpsteer_jax.scoring.model import ModelScorer
from helpsteer_jax.scoring.scorer import Scorer


def default_attributes(config: ml_collections.ConfigDict) -> dict[str, int]:
  """The attribute values a request gets unless it names others: the config's,
  else the `steerlm` section of the model's export, else NeMo's defaults."""
  return steering.run_attributes(config, weights.steer_spec(config))


@dataclasses.dataclass
class Policy:
  """The engine and how text becomes its prompt ids and back."""

  engine: Engine
  tokenizer: Any
  encode: Callable[[str], list[int]]  # a rendered chat prompt (steering.encode_prompt)

  def encode_plain(self, text: str) -> list[int]:
    """`text` as the tokenizer itself encodes it, with its own special tokens (a BOS only
    where it adds one): a completions prompt, as other servers encode it."""
    return list(self.tokenizer(text)["input_ids"])

  def decode(self, ids: list[int]) -> str:
    return self.tokenizer.decode(ids, skip_special_tokens=False)


def load_policy(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                workdir: pathlib.Path) -> Policy:
  """The model (HF directory or Orbax checkpoint) behind a warmed-up `Engine`."""
  model, tokenizer, pad = loader.load_with_tokenizer(config, rt, workdir)
  serve = config.serve
  engine = make_engine(model, rt.mesh, tokenizer, rules=rt.rules, max_batch=serve.max_batch,
                       max_length=serve.max_length or None, chunk_steps=serve.chunk_steps,
                       pad_id=pad, stop_strings=tuple(config.stop_strings),
                       prefill_chunk=serve.prefill_chunk)
  return Policy(engine, tokenizer, functools.partial(steering.encode_prompt, tokenizer=tokenizer,
                                                     add_bos=config.add_bos))


@dataclasses.dataclass
class AttributeModel:
  """The scorer behind the reward routes, the default weights of its reward, the length
  of a conversation's input ids (None: a source whose input this server does not build)
  and the kind of generative judge it is (`scorer.judge`; "": not a judge)."""

  scorer: Scorer
  weights: np.ndarray
  tokens: Callable[[Conversation], int] | None = None
  judge: str = ""


def load_attribute_model(config: ml_collections.ConfigDict,
                         rt: runtime.Runtime) -> AttributeModel | None:
  """`config.scorer`'s attribute model (None while `scorer.source` is empty): any scorer
  source (an attribute_model run, its HF export, an HF backbone with `scorer.head`, ...)."""
  if not config.scorer.source:
    return None
  scorer = load_scorer(config.scorer, rt)
  logging.info("attribute model loaded from %s", config.scorer.source)
  tokens = None
  if isinstance(scorer, ModelScorer):
    tok = scorer.tok
    tokens = lambda conv: len(tok.ids(conv))  # noqa: E731 - fits: the scorer scored it
  return AttributeModel(scorer, rewards.weight_vector(config.scorer.weights.to_dict()), tokens,
                        str(config.scorer.get("judge") or ""))
