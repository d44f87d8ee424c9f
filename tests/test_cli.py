"""The command-line entry point: dispatch, config overrides and errors."""

import json

import numpy as np
import pytest
import transformers
from torch_reference import needs_torch, torch

from helpsteer_jax.data.demo import tokenizer as demo_tokenizer

from cli_utils import run_main


def test_model_smoke_default_runs(tmp_path):
  proc = run_main("--config=configs/model_smoke.py", f"--workdir={tmp_path}",
                  "--config.mesh.data=2", "--config.mesh.tensor=2")
  summary = json.loads((tmp_path / "model_smoke.json").read_text())
  assert summary["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
  assert summary["num_params"] > 0
  assert "P(None, 'fsdp', 'tensor', None)" in summary["params"]["layers/attn/q_proj"]
  assert "parameters:" in proc.stdout


@needs_torch
def test_model_smoke_imports_hf_directory(tmp_path):
  """An HF Llama made by transformers: our top next token equals PyTorch's."""
  tok_dir = demo_tokenizer.build_demo_tokenizer(tmp_path / "tok")
  tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2)
  model = transformers.LlamaForCausalLM(cfg).eval()
  model.save_pretrained(tmp_path / "hf")
  tok.save_pretrained(tmp_path / "hf")
  prompt = "What is the capital of France?"
  with torch.no_grad():
    logits = model(torch.tensor([tok(prompt).input_ids])).logits[0, -1].numpy()
  run_main("--config=configs/model_smoke.py", f"--workdir={tmp_path / 'w'}",
           f"--config.init.source={tmp_path / 'hf'}", f"--config.prompt={prompt}",
           "--config.mesh.fsdp=4", "--config.mesh.tensor=2")
  summary = json.loads((tmp_path / "w" / "model_smoke.json").read_text())
  assert summary["top_next_tokens"][0] == tok.decode([int(np.argmax(logits))])
  assert summary["num_params"] == sum(p.numel() for p in model.parameters())


def test_unknown_config_key_lists_valid_keys():
  proc = run_main("--config=configs/model_smoke.py", "--config.model.num_layerz=3", check=False)
  assert proc.returncode == 2
  assert "unknown key 'model.num_layerz'" in proc.stderr
  assert "num_layers" in proc.stderr and "Traceback" not in proc.stderr


def test_a_misspelt_key_suggests_the_closest_one():
  proc = run_main("--config=configs/model_smoke.py", "--config.mdoel.num_layers=3", check=False)
  assert proc.returncode == 2
  assert "unknown key 'mdoel.num_layers': did you mean 'model.num_layers'?" in proc.stderr
  proc = run_main("--config=configs/model_smoke.py", "--config.zzz=3", check=False)
  assert "did you mean" not in proc.stderr and "config has keys" in proc.stderr


def test_bad_training_counts_fail_before_anything_is_written(tmp_path):
  """Every count out of range is named, in one error."""
  work = tmp_path / "run"
  proc = run_main("--config=configs/acsft.py", f"--workdir={work}",
                  "--config.train.num_steps=-1", "--config.train.global_batch=0",
                  "--config.train.eval_every=-5", check=False)
  assert proc.returncode == 2, proc.stderr
  for message in ("train.num_steps=-1 must be at least 1",
                  "train.global_batch=0 must be at least 1",
                  "train.eval_every=-5 must be at least 0"):
    assert message in proc.stderr, proc.stderr
  assert "Traceback" not in proc.stderr
  assert not work.exists() or not any(work.iterdir()), sorted(work.iterdir())


def test_a_missing_run_names_the_task_that_writes_it(tmp_path):
  proc = run_main("--config=configs/rl.py", f"--workdir={tmp_path / 'rl'}",
                  f"--config.init.source={tmp_path / 'acsft'}", check=False)
  assert proc.returncode == 2
  assert "no Orbax checkpoint in" in proc.stderr
  assert "helpsteer-jax --config=acsft" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_task_lists_valid_tasks():
  proc = run_main("--config=configs/model_smoke.py", "--config.task=nope", check=False)
  assert proc.returncode == 2
  assert "Unknown task 'nope'; valid tasks: " in proc.stderr
  assert "model_smoke" in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["--config.mesh.data=3"], "not divisible by the fixed axes' product 3"),
    (["--config.mesh.tensor=4"], "kv_heads=2 is not divisible by mesh axes 'tensor' (4 shards)"),
    (["--config.batch_size=6"], "batch size 6 is not divisible by the 8 batch shards"),
])
def test_impossible_configs_fail_before_compiling(args, message):
  proc = run_main("--config=configs/model_smoke.py", *args, check=False)
  assert proc.returncode == 2, proc.stderr
  assert message in proc.stderr
  assert "Traceback" not in proc.stderr
