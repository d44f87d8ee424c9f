"""Training a non-Llama family end to end: Gemma 2 (soft-capped logits, windows).

References: transformers' Gemma2ForCausalLM, whose soft-capped logits give the
per-token log-probs our fused losses must reproduce, and transformers loading
what AC-SFT exports. The training runs start from a Gemma 2 of our own export.
"""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from torch_reference import needs_torch, torch

from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.losses.pair_logprobs import model_segment_logps
from helpsteer_jax.losses.sft import sft_loss
from helpsteer_jax.models import builder, hf

from cli_utils import run_main


def _gemma2_config(vocab_size: int) -> transformers.Gemma2Config:
  """Three layers (sliding, full, sliding), a 6-token window, small soft-caps."""
  return transformers.Gemma2Config(
      vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
      num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
      sliding_window=6, attn_logit_softcapping=3.0, final_logit_softcapping=4.0,
      max_position_embeddings=256, initializer_range=0.2, attn_implementation="eager")


def _gemma2(vocab_size: int, seed: int = 0):
  """A random transformers Gemma2ForCausalLM of `_gemma2_config`."""
  torch.manual_seed(seed)
  return transformers.Gemma2ForCausalLM(_gemma2_config(vocab_size)).eval()


def _hf_token_logprobs(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
  with torch.no_grad():
    logits = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                   position_ids=torch.tensor(positions)).logits[:, :-1].float()
  logp = torch.log_softmax(logits, -1)
  return torch.gather(logp, -1, torch.tensor(tokens[:, 1:, None])).squeeze(-1).numpy()


@needs_torch
def test_fused_losses_equal_transformers_on_gemma2(tmp_path):
  """SFT NLL and 2D-DPO per-segment sums from the fused (soft-capped) passes
  equal the log-probs of transformers' Gemma 2 logits."""
  model = _gemma2(vocab_size=256)
  model.save_pretrained(tmp_path)
  ours = hf.load_hf_model(tmp_path)
  rng = np.random.RandomState(0)
  batch, length = 4, 33
  tokens = rng.randint(3, 256, (batch, length))
  mask = np.ones((batch, length), np.int32)
  mask[1, 25:] = mask[3, 20:] = 0  # right padding
  tokens = np.where(mask == 1, tokens, 0)
  ref_lp = _hf_token_logprobs(model, tokens, mask)
  ref_lp = np.where(mask[:, 1:] == 1, ref_lp, 0.0)

  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  seg = mask[:, :-1]
  positions = np.clip(np.cumsum(seg, axis=1) - 1, 0, None)
  weights = (mask[:, 1:] == 1).astype(np.float32)
  sft = dict(inputs=inputs, targets=targets, positions=positions, segment_ids=seg,
             weights=weights)
  total, aux = sft_loss(ours, jax.tree.map(jnp.asarray, sft), chunk_size=8)
  np.testing.assert_allclose(float(total), -ref_lp.sum(), rtol=1e-5)
  assert float(aux["weight"]) == weights.sum()

  # Pairs: rows (0, 1) and (2, 3); two segments per response split at token 10.
  token_segments = np.where(weights > 0, np.where(np.arange(length - 1) < 10, 1, 2), 0)
  fold = lambda x: x.reshape(2, 2, *x.shape[1:])
  pair = dict(inputs=fold(inputs), targets=fold(targets), positions=fold(positions),
              segment_ids=fold(seg), token_segments=fold(token_segments),
              seg_mask=np.ones((2, 2, 2), np.float32))
  for vocab_chunk in (0, 64):
    sums = model_segment_logps(ours, jax.tree.map(jnp.asarray, pair), 8, vocab_chunk)
    ref = np.stack([np.where(token_segments == k, ref_lp, 0).sum(-1) for k in (1, 2)], -1)
    np.testing.assert_allclose(np.asarray(sums).reshape(4, 2), ref, rtol=1e-5)


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory):
  """A random Gemma 2 of `_gemma2_config` with the demo tokenizer, as an HF directory."""
  out = tmp_path_factory.mktemp("gemma2")
  tok_dir = demo_tokenizer.build_demo_tokenizer(out / "tok")
  tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
  cfg = hf.config_from_hf(_gemma2_config(vocab_size=len(tok)).to_dict())
  hf.save_hf_model(builder.create(cfg, seed=0), out / "hf", dtype="float32", tokenizer=tok_dir)
  return out / "hf"


@pytest.fixture(scope="module")
def gemma2_sft(gemma2_dir, tmp_path_factory):
  """The workdir of two AC-SFT steps from `gemma2_dir`, exported in float32."""
  sft_dir = tmp_path_factory.mktemp("acsft")
  run_main("--config=configs/acsft.py:smollm2_135m", f"--workdir={sft_dir}",
           f"--config.init.source={gemma2_dir}", "--config.train.num_steps=2",
           "--config.train.seq_len=128", "--config.train.global_batch=8",
           "--config.train.micro_batch=8", "--config.train.loss_chunk_size=64",
           "--config.train.eval_every=0", "--config.train.log_every=1",
           "--config.data.demo_train_rows=64", "--config.data.demo_validation_rows=8",
           "--config.optimizer.warmup_steps=1", "--config.mesh.fsdp=4", "--config.mesh.tensor=2",
           "--config.model.attention_block_size=64", "--config.train.export_dtype=float32")
  return sft_dir


def test_acsft_then_2d_dpo_on_gemma2(gemma2_sft, tmp_path):
  """AC-SFT from an HF Gemma 2 exports a Gemma 2; 2D-DPO starts from that export
  with the policy equal to its on-the-fly reference."""
  sft_dir = gemma2_sft
  summary = json.loads((sft_dir / "summary.json").read_text())
  assert summary["status"] == "finished" and summary["step"] == 2
  exported = json.loads((sft_dir / "hf" / "config.json").read_text())
  assert exported["model_type"] == "gemma2"
  assert exported["final_logit_softcapping"] == 4.0 and exported["sliding_window"] == 6

  dpo_dir = tmp_path / "dpo2d"
  run_main("--config=configs/dpo2d.py:llama3_8b", f"--workdir={dpo_dir}",
           f"--config.init.source={sft_dir / 'hf'}", "--config.reference.mode=on_the_fly",
           "--config.train.num_steps=1", "--config.train.seq_len=128",
           "--config.train.global_batch=8", "--config.train.micro_batch=8",
           "--config.train.loss_chunk_size=64", "--config.train.log_every=1",
           "--config.train.export_hf=False", "--config.data.demo_train_pairs=16",
           "--config.data.demo_validation_pairs=0", "--config.data.max_segments=4",
           "--config.optimizer.schedule=constant", "--config.optimizer.warmup_steps=0",
           "--config.model.dtype=float32",
           "--config.mesh.fsdp=4", "--config.mesh.tensor=2",
           "--config.model.attention_block_size=64")
  rows = [json.loads(line) for line in (dpo_dir / "metrics.jsonl").read_text().splitlines()]
  first = next(r for r in rows if r.get("step") == 1 and "loss" in r)
  assert math.isfinite(first["loss"]) and abs(first["reward_margin"]) < 1e-4


@needs_torch
def test_the_gemma2_export_loads_in_transformers(gemma2_sft):
  """transformers loads what AC-SFT exported from the Gemma 2 as a Gemma2ForCausalLM."""
  model = transformers.AutoModelForCausalLM.from_pretrained(gemma2_sft / "hf")
  assert isinstance(model, transformers.Gemma2ForCausalLM)


def test_demo_shape_settings_conflict_with_a_checkpoint(gemma2_dir, tmp_path):
  """The demo recipe's tiny shape cannot load another checkpoint: a clear error
  before any data is read, not a missing tensor."""
  proc = run_main("--config=configs/acsft.py", f"--workdir={tmp_path}",
                  f"--config.init.source={gemma2_dir}", check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "model.num_layers=4 (the checkpoint has 3)" in proc.stderr
  assert "smollm2_135m" in proc.stderr and "train data" not in proc.stderr
