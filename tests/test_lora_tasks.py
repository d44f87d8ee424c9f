"""LoRA in the tasks: AC-SFT, the attribute model and RL train adapters on an HF base and
export them as PEFT directories; generation takes a base plus an adapter.

References: `peft` on transformers' PyTorch models (`PeftModel.from_pretrained`
over the base: the causal LM, and the sequence classifier with the trained
`score` head PEFT keeps whole) against the merged export loaded by
transformers, and configs/generate.py's greedy text from the merged export.
"""

import json
import warnings

import numpy as np
import pytest
import torch_reference
import transformers
from torch_reference import needs_peft, peft

from helpsteer_jax import runtime
from helpsteer_jax.config_base import SHAPE_FIELDS
from helpsteer_jax.data import chat_template
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.tasks import acsft, attribute_model, generate

from task_configs import TINY_SHAPE, short_config

ATOL = 1e-4


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
  """A tiny random causal LM with the demo tokenizer, as an HF directory."""
  root = tmp_path_factory.mktemp("base")
  tok = demo_tokenizer.build_demo_tokenizer(root / "tok")
  shape = {k: v for k, v in TINY_SHAPE.items() if k not in ("name", "attention_block_size")}
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1, **shape), seed=0)
  hf.save_hf_model(model, root / "hf", dtype="float32", tokenizer=str(tok))
  return root / "hf"


def _on_base(cfg, base_dir, rank=4):
  cfg.init.source = str(base_dir)
  for name in SHAPE_FIELDS:
    cfg.model[name] = None
  cfg.model.lora.update(rank=rank, alpha=2.0 * rank)
  cfg.train.update(num_steps=6, export_merged=True)
  cfg.optimizer.update(lr=1e-2, warmup_steps=1)
  return cfg


def _tokens(vocab):
  rng = np.random.RandomState(0)
  tokens = rng.randint(3, vocab, size=(2, 16)).astype(np.int64)
  return tokens, np.ones_like(tokens), np.broadcast_to(np.arange(16), tokens.shape).copy()


@needs_peft
def test_acsft_lora_exports_a_peft_adapter_and_generate_takes_it(base_dir, tmp_path):
  work = tmp_path / "acsft"
  summary = acsft.run(_on_base(short_config("acsft", export=True), base_dir), str(work))
  assert summary["status"] == "finished"
  adapter = work / "adapter"
  config = json.loads((adapter / "adapter_config.json").read_text())
  assert config["task_type"] == "CAUSAL_LM" and config["base_model_name_or_path"] == str(base_dir)
  assert (adapter / "chat_template.jinja").is_file()  # steering travels with the adapter
  assert chat_template.read_spec(adapter) is not None and "steerlm" not in config

  base = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tuned = peft.PeftModel.from_pretrained(base, adapter).eval()
  assert not [w for w in caught if "Unexpected keyword" in str(w.message)], caught
  merged = transformers.AutoModelForCausalLM.from_pretrained(work / "hf").eval()
  tokens, mask, positions = _tokens(base.config.vocab_size)
  want = torch_reference.logits(tuned, tokens, mask, positions)
  np.testing.assert_allclose(torch_reference.logits(merged, tokens, mask, positions), want,
                             atol=ATOL, rtol=0)
  with tuned.disable_adapter():
    assert np.abs(torch_reference.logits(tuned, tokens, mask, positions) - want).max() > 1e-4

  # Ours: the base plus the adapter directory.
  gen = generate_config(base_dir, adapter)
  rt = runtime.setup(gen)
  ours = runtime.build_model(gen, rt)
  hidden = ours(tokens.astype(np.int32), positions.astype(np.int32))
  np.testing.assert_allclose(np.asarray(ours.logits(hidden)), want, atol=ATOL, rtol=0)

  # Generation from base + adapter equals generation from the merged export.
  prompts = tmp_path / "in.jsonl"
  prompts.write_text(json.dumps({"prompt": "Name two fruits."}) + "\n")
  rows = {}
  for name, cfg in (("adapter", generate_config(base_dir, adapter)),
                    ("merged", generate_config(work / "hf"))):
    cfg.input = str(prompts)
    generate.run(cfg, str(tmp_path / name))
    rows[name] = json.loads((tmp_path / name / "generations.jsonl").read_text())
  assert rows["adapter"]["response"] == rows["merged"]["response"]


def generate_config(hf_path, adapter=None):
  import runpy

  from conftest import REPO_ROOT
  cfg = runpy.run_path(str(REPO_ROOT / "configs" / "generate.py"))["get_config"]()
  cfg.init.source = str(hf_path)
  if adapter is not None:
    cfg.model.lora.adapter = str(adapter)
  cfg.update(max_new_tokens=8, batch_size=1)
  return cfg


@needs_peft
def test_attribute_model_lora_exports_a_peft_sequence_classifier(base_dir, tmp_path):
  work = tmp_path / "rm"
  cfg = _on_base(short_config("attribute_model", export=True), base_dir, rank=2)
  assert attribute_model.run(cfg, str(work))["status"] == "finished"
  adapter = work / "adapter"
  config = json.loads((adapter / "adapter_config.json").read_text())
  assert config["task_type"] == "SEQ_CLS" and config["modules_to_save"] == ["score"]

  tok = hf.load_tokenizer(base_dir)
  base = transformers.AutoModelForSequenceClassification.from_pretrained(
      base_dir, num_labels=len(ATTRIBUTES), pad_token_id=tok.pad_token_id).eval()
  tuned = peft.PeftModel.from_pretrained(base, adapter).eval()
  merged = transformers.AutoModelForSequenceClassification.from_pretrained(work / "hf").eval()
  assert merged.config.id2label[0] == ATTRIBUTES[0]
  tokens, mask, positions = _tokens(base.config.vocab_size)
  want = torch_reference.logits(tuned, tokens, mask, positions)
  np.testing.assert_allclose(torch_reference.logits(merged, tokens, mask, positions), want,
                             atol=ATOL, rtol=0)
  assert np.abs(want).max() > 1e-3  # the head trained


@needs_peft
def test_rl_lora_exports_a_peft_adapter_of_the_trained_policy(base_dir, tmp_path):
  """RL with LoRA on an HF base: the PEFT adapter over the base in transformers gives the
  merged export's logits, and ours from base + adapter; the adapters moved off zero."""
  import runpy

  from helpsteer_jax.tasks import rl

  from conftest import REPO_ROOT

  cfg = runpy.run_path(str(REPO_ROOT / "configs" / "rl.py"))["get_config"]()
  cfg.init.source = ""
  cfg = _on_base(cfg, base_dir)
  cfg.scorer.source = "fake_scorer:make_brevity"
  cfg.prompts.update(demo_train_prompts=8, eval_limit=1)
  cfg.rollout.update(prompts_per_iteration=2, samples_per_prompt=4, max_new_tokens=8)
  cfg.train.update(num_steps=2, global_batch=8, micro_batch=8, seq_len=128,
                   loss_chunk_size=64, eval_every=0, async_checkpoint=False)
  work = tmp_path / "rl"
  assert rl.run(cfg, str(work))["status"] == "finished"
  adapter = work / "adapter"
  config = json.loads((adapter / "adapter_config.json").read_text())
  assert config["task_type"] == "CAUSAL_LM" and config["base_model_name_or_path"] == str(base_dir)

  base = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
  tuned = peft.PeftModel.from_pretrained(base, adapter).eval()
  merged = transformers.AutoModelForCausalLM.from_pretrained(work / "hf").eval()
  tokens, mask, positions = _tokens(base.config.vocab_size)
  want = torch_reference.logits(tuned, tokens, mask, positions)
  np.testing.assert_allclose(torch_reference.logits(merged, tokens, mask, positions), want,
                             atol=ATOL, rtol=0)
  with tuned.disable_adapter():
    assert np.abs(torch_reference.logits(tuned, tokens, mask, positions) - want).max() > 1e-4
  gen = generate_config(base_dir, adapter)
  ours = runtime.build_model(gen, runtime.setup(gen))
  hidden = ours(tokens.astype(np.int32), positions.astype(np.int32))
  np.testing.assert_allclose(np.asarray(ours.logits(hidden)), want, atol=ATOL, rtol=0)
