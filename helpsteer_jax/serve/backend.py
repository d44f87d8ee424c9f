"""What the server runs: the policy's engine, its default attributes, the attribute model.

The policy loads as configs/generate.py loads it (`inference.loading`: an HF
directory or any training task's Orbax checkpoint). `default_attributes`
and `load_attribute_model` are the two seams for what a model directory may
carry with it (saved steering defaults, an attribute model export).
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging

from helpsteer_jax import reward_runtime, runtime
from helpsteer_jax.data import template
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.data.features.rm import RegressionTokenizer
from helpsteer_jax.data.records import NUM_ATTRIBUTES, Conversation
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import best_of_n, loading, steering
from helpsteer_jax.inference.engine import Engine
from helpsteer_jax.inference.generator import eos_ids, stop_tokens
from helpsteer_jax.inference.scoring import RewardModelScorer
from helpsteer_jax.models import hf, reward_hf

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
  """XLA compilations in this process so far (JAX's monitoring events)."""

  def __init__(self):
    self.count = 0
    self._lock = threading.Lock()
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, event: str, duration: float, **kwargs: Any) -> None:
    if event == BACKEND_COMPILE_EVENT:
      with self._lock:
        self.count += 1


def default_attributes(config: ml_collections.ConfigDict) -> dict[str, int]:
  """The attribute values a request gets unless it names others: the config's,
  else the `steerlm` section of the model's export, else NeMo's defaults."""
  return steering.run_attributes(config, loading.steer_spec(config))


@dataclasses.dataclass
class Policy:
  """The engine and how text becomes its prompt ids."""

  engine: Engine
  tokenizer: Any
  encode: Callable[[str], list[int]]


def load_policy(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                workdir: pathlib.Path) -> Policy:
  """The model (HF directory or Orbax checkpoint) behind a warmed-up `Engine`."""
  model, tokenizer, pad = loading.load_with_tokenizer(config, rt, workdir)
  stops = tuple(config.stop_strings)
  eos = eos_ids(tokenizer, model.cfg.eos_token_id)
  serve = config.serve
  engine = Engine(model, rt.mesh, tokenizer, rules=rt.rules, max_batch=serve.max_batch,
                  max_length=serve.max_length or model.cfg.max_position_embeddings,
                  chunk_steps=serve.chunk_steps, pad_id=pad,
                  stop_ids=stop_tokens(tokenizer, stops, eos).ids, eos_ids=eos,
                  stop_strings=stops)

  def encode(text: str) -> list[int]:
    pieces = [template.Piece(text, False)]
    return tokenize.tokenize_pieces(pieces, tokenizer, add_bos=config.add_bos).ids.tolist()

  return Policy(engine, tokenizer, encode)


def _pieces_of_text(text: str) -> list[template.Piece]:
  """`template.regression_pieces` of an attribute-model input text (ValueError if not one)."""
  header = f"{template.TURN_START}Assistant{template.END_OF_NAME}"
  prefix, sep, response = text.removesuffix(template.LABEL_START).rpartition(header)
  if not text.endswith(template.LABEL_START) or not sep:
    raise ValueError("not an attribute-model input: expected a conversation ending in an"
                     f" assistant turn and {template.LABEL_START!r}")
  return [template.Piece(prefix, False), template.Piece(header, False),
          template.Piece(response, True), template.Piece(template.LABEL_START, True)]


class AttributeModel:
  """The attribute model behind the reward endpoint: [n, 9] predictions, NaN for
  inputs too long to score (after the configured truncation)."""

  def __init__(self, scorer: RewardModelScorer, tok: RegressionTokenizer,
               weights: np.ndarray):
    self.scorer, self.tok, self.weights = scorer, tok, weights
    self._lock = threading.Lock()  # one scoring batch at a time

  def _score(self, ids: Sequence[np.ndarray | None]) -> np.ndarray:
    out = np.full((len(ids), NUM_ATTRIBUTES), np.nan, np.float32)
    kept = [i for i, x in enumerate(ids) if x is not None]
    with self._lock:
      out[kept] = self.scorer.score([ids[i] for i in kept])
    return out

  def score_conversations(self, convs: Sequence[Conversation]) -> np.ndarray:
    return self._score([self.tok.ids(c) for c in convs])

  def score_texts(self, texts: Sequence[str]) -> np.ndarray:
    ids = []
    for text in texts:
      example = tokenize.tokenize_pieces(_pieces_of_text(text), self.tok.tokenizer,
                                         add_bos=self.tok.add_bos)
      fitted = tokenize.truncate(example, self.tok.max_len, self.tok.truncation)
      ids.append(None if fitted is None else fitted.ids)
    return self._score(ids)


def load_attribute_model(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                         workdir: pathlib.Path) -> AttributeModel | None:
  """The attribute model of `config.reward` (None when none is configured).

  `reward.checkpoint` is an attribute_model workdir (backbone and head) or its
  HF sequence-classification export, or `reward.model.hf_path` with
  `reward.head` a head file; its shape flags are
  `reward.model.*`, as annotate's `model.*`.
  """
  r = config.reward
  if not r.checkpoint and not r.model.hf_path:
    return None
  if not r.checkpoint and r.head in ("auto", "zeros"):
    raise ConfigError("reward.model.hf_path needs --config.reward.head=<head.npz> (or use"
                      " --config.reward.checkpoint=<attribute_model workdir>)")
  sub = ml_collections.ConfigDict(dict(
      seed=config.seed, model=r.model, tokenizer=r.tokenizer, checkpoint=r.checkpoint,
      init=reward_runtime.init_config(checkpoint=r.checkpoint, head=r.head)))
  model = reward_runtime.build_reward_model(sub, rt)
  if r.checkpoint and not r.tokenizer and reward_hf.is_reward_dir(r.checkpoint):
    tok_dir = r.checkpoint  # an HF export carries its tokenizer
  else:
    tok_dir = loading.tokenizer_dir(sub, workdir)
  tokenizer = hf.load_tokenizer(tok_dir)
  scorer = RewardModelScorer(model, rt, r.batch_size, r.pad_multiple)
  tok = RegressionTokenizer(tokenizer, r.max_len, r.truncation, r.add_bos)
  logging.info("attribute model loaded from %s", r.checkpoint or r.model.hf_path)
  return AttributeModel(scorer, tok, best_of_n.weight_vector(r.weights.to_dict()))
