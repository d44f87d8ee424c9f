"""HF `config.json` <-> `ModelConfig` for every family: round trips of the
named models through transformers 5 `AutoConfig`, v4-style RoPE, and the
settings a family cannot import or export (named in the error)."""

import json

import pytest

from helpsteer_jax.models import catalog, hf
from helpsteer_jax.models.config import RopeScaling

transformers = pytest.importorskip("transformers")


def test_config_round_trip_named_models(tmp_path):
  """config_from_hf(config_to_hf(cfg)) == cfg, and transformers 5
  `AutoConfig` reads what we write."""
  for name in ("llama2_7b", "llama3_1_70b", "llama3_2_1b", "mistral_7b", "qwen2_7b",
               "qwen3_8b", "gemma2_2b", "smollm2_135m"):
    cfg = catalog.model_config(name)
    raw = hf.config_to_hf(cfg, "bfloat16")
    assert hf.config_from_hf(raw) == cfg, name
    (tmp_path / "config.json").write_text(json.dumps(raw))
    auto = transformers.AutoConfig.from_pretrained(tmp_path)
    assert auto.model_type == cfg.hf_model_type
    head_dim = getattr(auto, "head_dim", None)  # as HF modeling code reads it
    assert (head_dim or auto.hidden_size // auto.num_attention_heads) == cfg.head_dim
    assert auto.rope_parameters["rope_theta"] == cfg.rope_theta
    assert auto.rope_parameters["rope_type"] == (
        "llama3" if cfg.rope_scaling else "default")


def test_v4_style_rope_scaling():
  """Llama 3.1 configs written by transformers 4 (`rope_scaling` + `type`)."""
  raw = hf.config_to_hf(catalog.model_config("llama3_1_8b"))
  raw.pop("rope_parameters")
  raw["rope_scaling"] = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}
  cfg = hf.config_from_hf(raw, param_dtype="bfloat16")
  assert cfg.rope_scaling == RopeScaling() and cfg.rope_theta == 500000.0
  assert cfg.param_dtype == "bfloat16"


def _llama_raw(name="tiny", **changes):
  raw = hf.config_to_hf(catalog.model_config(name))
  raw.update(changes)
  return raw


@pytest.mark.parametrize("raw,message", [
    (_llama_raw(attention_bias=True), "attention_bias=true"),
    (_llama_raw(mlp_bias=True), "mlp_bias=true"),
    (_llama_raw(hidden_act="gelu"), "hidden_act='gelu'"),
    (_llama_raw(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4,
                                 "factor": 4.0}), "rope_type='yarn'"),
    (_llama_raw(rope_parameters=None, rope_scaling={"type": "linear", "factor": 2.0}),
     "rope_type='linear'"),
    (_llama_raw(model_type="qwen2", use_sliding_window=True), "use_sliding_window=true"),
    (_llama_raw(model_type="gemma"), "model_type 'gemma'"),
    (_llama_raw("qwen3_8b", attention_bias=True), "attention_bias=true"),
    (_llama_raw("qwen3_8b", use_sliding_window=True), "use_sliding_window=true"),
    (_llama_raw("gemma2_2b", hidden_activation="gelu"), "hidden_activation='gelu'"),
    (_llama_raw("mistral_7b", layer_types=["full_attention"] * 32), "layer_types"),
])
def test_unsupported_configs(raw, message):
  with pytest.raises(hf.UnsupportedCheckpointError, match=message):
    hf.config_from_hf(raw)


@pytest.mark.parametrize("name,knob", [
    ("tiny", dict(attention_bias=True)), ("tiny", dict(qk_norm=True)),
    ("qwen3_0_6b", dict(sliding_window=64)), ("gemma2_2b", dict(norm_unit_offset=False))])
def test_unexportable_config(name, knob):
  """A knob the family's HF format fixes otherwise is refused on export."""
  cfg = catalog.model_config(name, **knob)
  with pytest.raises(hf.UnsupportedCheckpointError, match=next(iter(knob))):
    hf.config_to_hf(cfg)
