"""The catalog's model shapes against published parameter counts (abstract evaluation only)."""

import time

import pytest
from flax import nnx

from helpsteer_jax.models import builder, catalog, families

pytestmark = pytest.mark.version_tier

# Published totals (model cards / HF safetensors metadata), in parameters, as
# given: the count must round to them (half a unit of the last digit).
PUBLISHED = {
    "llama2_7b": "6.74e9",
    "llama2_13b": "13.02e9",
    "llama2_70b": "68.98e9",
    "llama3_8b": "8.03e9",
    "llama3_70b": "70.55e9",
    "llama3_1_8b": "8.03e9",
    "llama3_1_70b": "70.55e9",
    "llama3_2_1b": "1.24e9",
    "llama3_2_3b": "3.21e9",
    "mistral_7b": "7.24e9",
    "qwen2_7b": "7.62e9",
    "qwen3_0_6b": "0.596e9",
    "qwen3_8b": "8.19e9",
    "gemma2_2b": "2.61e9",
    "gemma2_9b": "9.24e9",
    "smollm2_135m": "134.5e6",
}
# Qwen3's model cards also give the count without the embeddings (and LM head).
PUBLISHED_NON_EMBEDDING = {"qwen3_0_6b": "0.44e9", "qwen3_8b": "6.95e9"}


def _assert_rounds_to(count: int, published: str, name: str):
  mantissa, exponent = published.split("e")
  decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
  half_unit = 0.5 * 10 ** (int(exponent) - decimals)
  assert abs(count - float(published)) <= half_unit, (name, count, published)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_published(name):
  cfg = catalog.model_config(name)
  start = time.perf_counter()
  _, state = builder.abstract_model(cfg)
  count = builder.count_params(state)
  assert time.perf_counter() - start < 60, "abstract evaluation must not allocate"
  assert count == cfg.num_params()
  _assert_rounds_to(count, PUBLISHED[name], name)
  if name in PUBLISHED_NON_EMBEDDING:
    embeddings = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    _assert_rounds_to(count - embeddings, PUBLISHED_NON_EMBEDDING[name], name)


def test_abstract_state_has_no_arrays():
  _, state = builder.abstract_model(catalog.model_config("llama3_70b"))
  leaves = [v.get_value() for v in builder.named_variables(state).values()]
  assert all(type(x).__name__ == "ShapeDtypeStruct" for x in leaves)


@pytest.mark.parametrize("name", ["qwen2_7b", "qwen3_8b", "gemma2_9b"])
def test_every_parameter_has_logical_axes(name):
  _, state = builder.abstract_model(catalog.model_config(name))
  for name, var in builder.named_variables(state).items():
    axes = var.get_metadata("logical_axes")
    assert len(axes) == len(var.shape), name
    if name.startswith("layers/"):
      assert axes[0] == "layers", name


def test_unknown_model_name_lists_valid_ones():
  with pytest.raises(ValueError, match="llama3_8b"):
    catalog.model_config("llama9_1t")


def _grad_hlo(cfg):
  import jax
  import jax.numpy as jnp
  from flax import nnx
  graphdef, state = builder.abstract_model(cfg)

  def loss(state, tokens):
    return nnx.merge(graphdef, state)(tokens).astype(jnp.float32).mean()

  tokens = jax.ShapeDtypeStruct((1, 64), jnp.int32)
  return jax.jit(jax.grad(loss)).lower(state, tokens).compile().as_text()


@pytest.mark.parametrize("name,shallow_layers", [("llama3_70b", 2), ("gemma2_9b", 4)])
def test_scanned_model_compiles_one_layer_body(name, shallow_layers):
  """80 stacked layers compile as one scanned layer (Gemma 2's 42 as one
  scanned (sliding, full) pair): the program size does not grow with depth."""
  deep = catalog.model_config(name, remat_policy="full", dtype="bfloat16")
  shallow = deep.replace(num_layers=shallow_layers)
  deep_hlo, shallow_hlo = _grad_hlo(deep), _grad_hlo(shallow)
  assert "while" in deep_hlo
  assert deep_hlo.count(" dot(") == shallow_hlo.count(" dot(")


@pytest.mark.parametrize("name", ["llama3_2_1b", "mistral_7b", "qwen2_7b", "qwen3_0_6b",
                                  "gemma2_2b"])
def test_family_infers_shapes_from_saved_parameters(name):
  """What `inference.loading` reads from an Orbax checkpoint's metadata: the
  family's shape inference gives back the named model's shape fields."""
  cfg = catalog.model_config(name)
  _, state = builder.abstract_model(cfg)
  shapes = {tuple(path): tuple(v.shape) for path, v in nnx.to_flat_state(state)}
  inferred = families.for_config(cfg).shape_fields(shapes)
  assert inferred == {k: getattr(cfg, k) for k in inferred}


def test_the_config_layer_names_every_model_in_the_catalog():
  from helpsteer_jax import config_sections
  assert config_sections.MODEL_NAMES == tuple(catalog.SHAPES)
