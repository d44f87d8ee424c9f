"""Each task's batch, declared once: field names, dtypes and symbolic shapes.

A field's shape names its axes: the first is the batch axis ("batch" rows,
"pairs" or "groups" of rows), then "length" (tokens), "segments", "aspects", or a
number. Everything that touches a batch derives from these declarations:

- featurizers make examples with `schema.example(...)` /
  `schema.zeros_example(...)`: the fields of origin "example", without the
  batch axis (packed fields may be shorter than `length`);
- packing / padding adds the fields of origin "pipeline" (segment ids and
  per-segment positions); the reference pass adds origin "reference";
- `train.abstract_step` compiles the step on `schema.row_fields(**dims)`;
- losses read `schema.view(batch)`, whose fields are checked once, at trace
  time;
- the reference pass stacks `REFERENCE_INPUT.names`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Mapping

import numpy as np

from helpsteer_jax.data.records import NUM_ATTRIBUTES

Dim = str | int
ORIGINS = ("example", "pipeline", "reference")


class SchemaError(ValueError):
  """Arrays that do not match a batch schema."""


@dataclasses.dataclass(frozen=True)
class Field:
  dtype: Any
  shape: tuple[Dim, ...]
  origin: str = "example"  # who writes it: the featurizer, the pipeline or the reference pass
  doc: str = ""

  def __post_init__(self):
    object.__setattr__(self, "dtype", np.dtype(self.dtype))
    if self.origin not in ORIGINS:
      raise ValueError(f"origin {self.origin!r}; choose one of {ORIGINS}")


class BatchSchema:
  """Named fields of a batch; `view` gives losses attribute access to them."""

  def __init__(self, name: str, **fields: Field):
    self.name, self.fields = name, fields
    self._view = collections.namedtuple(f"{name.title().replace('_', '')}Batch", list(fields))

  def __repr__(self) -> str:
    return f"BatchSchema({self.name!r}, {', '.join(self.fields)})"

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(self.fields)

  @property
  def batch_axis(self) -> str:
    """The name of the leading axis ("batch" or "pairs")."""
    return next(iter(self.fields.values())).shape[0]

  @property
  def example_names(self) -> tuple[str, ...]:
    """The fields a featurizer writes."""
    return tuple(k for k, f in self.fields.items() if f.origin == "example")

  def extend(self, name: str, **fields: Field) -> BatchSchema:
    return BatchSchema(name, **self.fields, **fields)

  def select(self, name: str, *names: str) -> BatchSchema:
    return BatchSchema(name, **{k: self.fields[k] for k in names})

  # -- shapes ---------------------------------------------------------------

  @staticmethod
  def _resolve(shape: tuple[Dim, ...], dims: Mapping[str, int]) -> tuple[int, ...]:
    missing = [d for d in shape if isinstance(d, str) and d not in dims]
    if missing:
      raise SchemaError(f"no size given for {missing} (given: {dict(dims)})")
    return tuple(d if isinstance(d, int) else int(dims[d]) for d in shape)

  def row_fields(self, **dims: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of one row of every field (the batch axis dropped)."""
    return {k: (self._resolve(f.shape[1:], dims), f.dtype) for k, f in self.fields.items()}

  def zeros_example(self, **dims: int) -> dict[str, np.ndarray]:
    """Zero-filled example fields, to be filled in by a featurizer."""
    return {k: np.zeros(self._resolve(self.fields[k].shape[1:], dims), self.fields[k].dtype)
            for k in self.example_names}

  def example(self, **arrays: Any) -> dict[str, np.ndarray]:
    """The example fields in declared order and dtypes (names must match exactly)."""
    if set(arrays) != set(self.example_names):
      raise SchemaError(f"{self.name} example: got fields {sorted(arrays)}, declared"
                        f" {list(self.example_names)}")
    return {k: np.asarray(arrays[k], self.fields[k].dtype) for k in self.example_names}

  # -- checks ---------------------------------------------------------------

  def check(self, arrays: Mapping[str, Any], *, batched: bool = True, only: str | None = None,
            **dims: int) -> dict[str, int]:
    """Names, dtypes and shapes of `arrays` against the schema; returns the axis sizes.

    `batched=False` checks one example (no batch axis); `only` restricts the
    fields to one origin ("example": a featurizer's output). Axis names not
    in `dims` take the size they first have, and must keep it.
    """
    names = self.names if only is None else tuple(
        k for k, f in self.fields.items() if f.origin == only)
    if set(arrays) != set(names):
      raise SchemaError(f"{self.name}: got fields {sorted(arrays)}, declared {list(names)}")
    sizes = dict(dims)
    for k in names:
      field, value = self.fields[k], arrays[k]
      if np.dtype(value.dtype) != field.dtype:
        raise SchemaError(f"{self.name}.{k}: dtype {value.dtype}, declared {field.dtype}")
      self._bind(k, field.shape if batched else field.shape[1:], value.shape, sizes)
    return sizes

  def _bind(self, name: str, declared: tuple[Dim, ...], shape: tuple[int, ...],
            sizes: dict[str, int]) -> None:
    if len(shape) != len(declared):
      raise SchemaError(f"{self.name}.{name}: shape {tuple(shape)}, declared {declared}")
    for axis, size in zip(declared, shape):
      want = sizes.setdefault(axis, size) if isinstance(axis, str) else axis
      if size != want:
        raise SchemaError(f"{self.name}.{name}: shape {tuple(shape)} has {axis}={size},"
                          f" declared {declared} with {axis}={want}")

  def view(self, batch: Mapping[str, Any]):
    """The declared fields of `batch` as a named tuple (extra fields are ignored).

    Ranks and axis sizes are checked (at trace time under jit); dtypes are
    left to `check`, since callers may pass host arrays of wider types.
    """
    missing = [k for k in self.names if k not in batch]
    if missing:
      raise SchemaError(f"{self.name} batch lacks {missing}; it has {sorted(batch)}")
    sizes: dict[str, int] = {}
    for k, field in self.fields.items():
      self._bind(k, field.shape, tuple(batch[k].shape), sizes)
    return self._view(*(batch[k] for k in self.names))


# ---------------------------------------------------------------- the batches

_TOKENS = ("batch", "length")
_PACKING = dict(
    segment_ids=Field(np.int32, _TOKENS, "pipeline", "1.. per packed sequence, 0 = padding"),
    positions=Field(np.int32, _TOKENS, "pipeline", "token index within its sequence"))

# AC-SFT: next-token prediction on packed rows.
SFT_BATCH = BatchSchema(
    "sft",
    inputs=Field(np.int32, _TOKENS, doc="token ids"),
    targets=Field(np.int32, _TOKENS, doc="the next token ids"),
    weights=Field(np.float32, _TOKENS, doc="1 where the target carries loss"),
    **_PACKING)

# Attribute model, regression: the head is read where `readout` is set.
REGRESSION_BATCH = BatchSchema(
    "regression",
    inputs=Field(np.int32, _TOKENS, doc="token ids"),
    labels=Field(np.float32, _TOKENS + (NUM_ATTRIBUTES,),
                 doc="attribute scores at a sequence's last token, IGNORE_LABEL elsewhere"),
    readout=Field(np.float32, _TOKENS, doc="1 at each sequence's last token"),
    **_PACKING)

# Attribute model, Bradley-Terry: one pair per row, two segments of its own.
BT_BATCH = BatchSchema(
    "bt",
    inputs=Field(np.int32, _TOKENS, doc="chosen then rejected token ids"),
    segment_ids=Field(np.int32, _TOKENS, doc="1 = chosen, 2 = rejected, 0 = padding"),
    positions=Field(np.int32, _TOKENS, doc="token index within its response"),
    pair=Field(np.int32, _TOKENS, doc="CHOSEN / REJECTED at each response's last token"),
    margin=Field(np.float32, _TOKENS, doc="the preference strength at the chosen mark"))

# 2D-DPO and its baselines: a pair is a chosen and a rejected row of fixed shape.
_ROWS = ("pairs", 2, "length")
PAIR_BATCH = BatchSchema(
    "pair",
    inputs=Field(np.int32, _ROWS, doc="token ids"),
    targets=Field(np.int32, _ROWS, doc="the next token ids"),
    positions=Field(np.int32, _ROWS, doc="token index"),
    segment_ids=Field(np.int32, _ROWS, doc="1 on real tokens, 0 = padding"),
    token_segments=Field(np.int32, _ROWS, doc="the response segment (1..S) of each target"),
    seg_scores=Field(np.float32, ("pairs", 2, "segments", "aspects"),
                     doc="aspect scores / score_max of each segment"),
    seg_mask=Field(np.float32, ("pairs", 2, "segments"), doc="1 for a real segment"),
    lengths=Field(np.float32, ("pairs", 2), doc="response tokens"),
    pair_weight=Field(np.float32, ("pairs", 2), doc="1 per real pair, 0 for padding rows"))

# With a cached reference pass: its per-segment log-prob sums ride in the batch.
CACHED_PAIR_BATCH = PAIR_BATCH.extend(
    "cached_pair",
    ref_logps=Field(np.float32, ("pairs", 2, "segments"), "reference",
                    "the reference model's per-segment log-prob sums"))

# What the reference pass (and the policy's forward) reads of a pair batch.
REFERENCE_INPUT = PAIR_BATCH.select(
    "reference_input", "inputs", "targets", "positions", "segment_ids", "token_segments",
    "seg_mask")

# SteerLM 2.0: a group of n responses to one prompt and attribute string, a row each,
# with the starting model's log-probabilities and the importance weights.
_GROUP = ("groups", "responses", "length")
STEERLM2_BATCH = BatchSchema(
    "steerlm2",
    inputs=Field(np.int32, _GROUP, doc="prompt (with its label) then response token ids"),
    targets=Field(np.int32, _GROUP, doc="the next token ids"),
    positions=Field(np.int32, _GROUP, doc="token index"),
    segment_ids=Field(np.int32, _GROUP, doc="1 on real tokens, 0 = padding"),
    weights=Field(np.float32, _GROUP, doc="1 where the target is a response token"),
    log_q=Field(np.float32, ("groups", "responses"), doc="log Q'(y|a,x), the starting model"),
    ws=Field(np.float32, ("groups", "responses"), doc="the importance weights (sum to 1)"),
    group_weight=Field(np.float32, ("groups", "responses"),
                       doc="1 on a real group's rows, 0 for padding"))
# What a forward pass over groups reads (the sampling phase's log-probabilities).
STEERLM2_INPUT = STEERLM2_BATCH.select(
    "steerlm2_input", "inputs", "targets", "positions", "segment_ids", "weights")

# Online RL: a prompt and its sampled completion per row, and per completion token
# ("completion" = max_new_tokens) the arrays the policy-gradient losses read.
_COMPLETION = ("batch", "completion")
ROLLOUT_BATCH = BatchSchema(
    "rollout",
    inputs=Field(np.int32, _TOKENS, doc="prompt then completion token ids, right-padded"),
    targets=Field(np.int32, _TOKENS, doc="the next token ids"),
    positions=Field(np.int32, _TOKENS, doc="token index"),
    segment_ids=Field(np.int32, _TOKENS, doc="1 on real tokens, 0 = padding"),
    at=Field(np.int32, _COMPLETION, doc="the row position predicting each completion token"),
    mask=Field(np.float32, _COMPLETION, doc="1 through the stop token"),
    advantages=Field(np.float32, _COMPLETION, doc="per-token advantage (0 on padding)"),
    old_logp=Field(np.float32, _COMPLETION, doc="log-prob under the sampling policy"),
    ref_logp=Field(np.float32, _COMPLETION, doc="log-prob under the reference"),
    sampler_weight=Field(np.float32, _COMPLETION,
                         doc="the sampler correction's weight (read only with it on)"))

# PPO: also the critic's values at sampling time and the GAE returns.
PPO_ROLLOUT_BATCH = ROLLOUT_BATCH.extend(
    "ppo_rollout",
    old_values=Field(np.float32, _COMPLETION, doc="the critic's values when sampled"),
    returns=Field(np.float32, _COMPLETION, doc="GAE advantages + values"))
