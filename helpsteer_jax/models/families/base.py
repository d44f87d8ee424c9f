"""What a model family is: HF config conversion, module, tensor mapping, shapes.

A `Family` is keyed by the HF `model_type`. Its `knobs` are the
`ModelConfig` fields that `model_type` fixes (Qwen3 always has q/k norms,
Llama never a window); `from_hf` / `to_hf` convert the family's own
`config.json` keys; `param_mappings` lists every parameter with its HF
tensor name and layout (used by import, export and the per-device block
reads); `shape_fields` infers the shape fields of a `ModelConfig` from
saved parameter shapes (Orbax checkpoints).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import numpy as np

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import safetensors_io as st
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.decoder import Decoder

# The family knobs of a plain Llama; each family states where it differs.
LLAMA_KNOBS: dict[str, Any] = dict(
    attention_bias=False, qk_norm=False, mlp_activation="silu", sandwich_norms=False,
    norm_unit_offset=False, scale_embeddings=False, query_pre_attn_scalar=None,
    attn_logit_softcap=None, final_logit_softcap=None, sliding_window=None,
    layer_types=None)

# Our layer norm -> HF module name (HF Llama's `post_attention_layernorm` is
# the norm before the MLP).
LLAMA_NORMS = {"input_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm"}


@dataclasses.dataclass(frozen=True)
class ParamMapping:
  """How one of our parameters relates to a HF tensor (`{i}` = layer).

  Ours (one layer of it, for stacked layer parameters) is the HF tensor,
  transposed if `transpose`, with axis j of the result split into the axes
  `axes[j]`: q_proj's `[n * hd, d] -> [d, n, hd]` is `transpose=True,
  axes=((d,), (n, hd))`.
  """

  path: tuple[str, ...]
  hf_name: str
  axes: tuple[tuple[int, ...], ...]
  transpose: bool = False

  @property
  def layered(self) -> bool:
    return "{i}" in self.hf_name

  @property
  def shape(self) -> tuple[int, ...]:
    """Our shape (of one layer)."""
    return tuple(n for group in self.axes for n in group)

  @property
  def hf_shape(self) -> tuple[int, ...]:
    merged = tuple(math.prod(group) for group in self.axes)
    return merged[::-1] if self.transpose else merged

  def to_ours(self, x: np.ndarray, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A HF tensor (or a block of it, which is `shape` in our layout) as ours."""
    return (x.T if self.transpose else x).reshape(shape or self.shape)

  def to_hf(self, a: np.ndarray) -> np.ndarray:
    merged = a.reshape(tuple(math.prod(group) for group in self.axes))
    return merged.T if self.transpose else merged

  def read(self, get: Callable[[st.Index], np.ndarray], index: st.Index) -> np.ndarray:
    """Our block `index` (a slice per axis), read with `get(hf_index)`.

    `get` is asked for the bounding block of the HF tensor only: where one
    HF axis is split into several of ours (heads and head_dim), for whole
    runs of the inner axes; the rest is sliced off after the conversion.
    """
    bounds, shape, rest = [], [], []
    ranges = iter(block_ranges(index, self.shape))
    for group in self.axes:
      (start, stop), *inner = (next(ranges) for _ in group)
      run = math.prod(group[1:])
      bounds.append(slice(start * run, stop * run))
      shape += [stop - start, *group[1:]]
      rest += [slice(None), *(slice(*r) for r in inner)]
    hf_index = tuple(bounds[::-1] if self.transpose else bounds)
    return self.to_ours(get(hf_index), tuple(shape))[tuple(rest)]


def block_ranges(index: st.Index, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """(start, stop) of each axis of a block index with unit steps."""
  out = []
  for sl, n in zip(index + (slice(None),) * (len(shape) - len(index)), shape):
    start, stop, step = sl.indices(n)
    if step != 1:
      raise ValueError(f"block index {index} has a step")
    out.append((start, stop))
  return tuple(out)


def decoder_mappings(cfg: ModelConfig, norms: Mapping[str, str] = LLAMA_NORMS
                     ) -> list[ParamMapping]:
  """Every parameter of the shared `Decoder(cfg)` with its HF name and layout.

  `norms` names the HF module of each of our layer norms (families differ
  only there); q/k norms and QKV biases follow the config's knobs.
  """
  d, f, v, hd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
  h, k = cfg.num_heads, cfg.num_kv_heads
  pre = "model.layers.{i}."

  def attn(name: str, theirs: str, axes: tuple[tuple[int, ...], ...],
           transpose: bool = True, ours: tuple[str, ...] = ()) -> ParamMapping:
    return ParamMapping(("layers", "attn", name) + ours, f"{pre}self_attn.{theirs}", axes,
                        transpose)

  def norm(ours: str) -> ParamMapping:
    return ParamMapping(("layers", ours, "scale"), f"{pre}{norms[ours]}.weight", ((d,),))

  def mlp(name: str, axes: tuple[tuple[int, ...], ...]) -> ParamMapping:
    return ParamMapping(("layers", "mlp", name), f"{pre}mlp.{name}.weight", axes, True)

  out = [ParamMapping(("embed",), "model.embed_tokens.weight", ((v,), (d,))),
         norm("input_norm"),
         attn("q_proj", "q_proj.weight", ((d,), (h, hd))),
         attn("k_proj", "k_proj.weight", ((d,), (k, hd))),
         attn("v_proj", "v_proj.weight", ((d,), (k, hd)))]
  if cfg.attention_bias:
    out += [attn("q_bias", "q_proj.bias", ((h, hd),), False),
            attn("k_bias", "k_proj.bias", ((k, hd),), False),
            attn("v_bias", "v_proj.bias", ((k, hd),), False)]
  if cfg.qk_norm:
    out += [attn("q_norm", "q_norm.weight", ((hd,),), False, ("scale",)),
            attn("k_norm", "k_norm.weight", ((hd,),), False, ("scale",))]
  out.append(attn("o_proj", "o_proj.weight", ((h, hd), (d,))))
  if cfg.sandwich_norms:
    out.append(norm("attn_output_norm"))
  out += [norm("post_attention_norm"),
          mlp("gate_proj", ((d,), (f,))), mlp("up_proj", ((d,), (f,))),
          mlp("down_proj", ((f,), (d,)))]
  if cfg.sandwich_norms:
    out.append(norm("mlp_output_norm"))
  out.append(ParamMapping(("final_norm", "scale"), "model.norm.weight", ((d,),)))
  if not cfg.tie_word_embeddings:
    out.append(ParamMapping(("lm_head",), "lm_head.weight", ((d,), (v,)), True))
  return out


def decoder_shape_fields(shapes: Mapping[tuple[str, ...], tuple[int, ...]]) -> dict[str, Any]:
  """`ModelConfig` shape fields from the saved parameter shapes of a `Decoder`."""
  try:
    vocab, hidden = shapes[("embed",)]
    layers, _, heads, head_dim = shapes[("layers", "attn", "q_proj")]
    kv_heads = shapes[("layers", "attn", "k_proj")][2]
    intermediate = shapes[("layers", "mlp", "gate_proj")][2]
  except (KeyError, ValueError) as e:
    raise ConfigError(f"the checkpoint does not hold a decoder's parameters"
                      f" (missing or odd {e}); it may be another model's checkpoint") from None
  return dict(vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
              num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=intermediate,
              tie_word_embeddings=("lm_head",) not in shapes,
              attention_bias=("layers", "attn", "q_bias") in shapes)


def cyclic(kinds: list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
  """The shortest prefix of `kinds` that repeats to all of it (HF layer_types)."""
  if not kinds:
    return None
  for period in range(1, len(kinds) + 1):
    if all(k == kinds[i % period] for i, k in enumerate(kinds)):
      return tuple(kinds[:period])
  return tuple(kinds)


@dataclasses.dataclass(frozen=True)
class Family:
  """One HF `model_type` and everything that differs between families.

  from_hf(raw, problems): the family's `ModelConfig` fields from its
    `config.json` (appending what it cannot express to `problems`).
  to_hf(cfg, common): the whole `config.json` from the keys every family
    writes (`hf_config.common_to_hf`).
  """

  model_type: str
  architecture: str
  knobs: Mapping[str, Any]
  from_hf: Callable[[Mapping[str, Any], list[str]], dict[str, Any]]
  to_hf: Callable[[ModelConfig, dict[str, Any]], dict[str, Any]]
  module: Callable[..., Any] = Decoder
  param_mappings: Callable[[ModelConfig], list[ParamMapping]] = decoder_mappings
  shape_fields: Callable[[Mapping[tuple[str, ...], tuple[int, ...]]], dict[str, Any]] = (
      decoder_shape_fields)

  def config_fields(self) -> dict[str, Any]:
    """The `ModelConfig` fields a named model (models/catalog.py) of this family starts from."""
    return dict(self.knobs, hf_model_type=self.model_type, hf_architecture=self.architecture)
