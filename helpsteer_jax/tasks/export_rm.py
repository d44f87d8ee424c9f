"""An existing attribute model as an HF *ForSequenceClassification directory.

Reads the model as the scoring tasks do (`init.source`: an
attribute-model workdir or Orbax checkpoint; or an HF backbone with
`init.head=<head.npz>`) and writes what the attribute-model task writes to
`<workdir>/hf` at the end of training: `transformers`'
`AutoModelForSequenceClassification` loads it.
"""

from __future__ import annotations

import pathlib

import ml_collections

from helpsteer_jax.load import model as loader
from helpsteer_jax.load import reward as reward_model
from helpsteer_jax.models import reward_hf
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  reward_model.require_trained(config, "export_rm")
  setup = setup_lib.prepare(config, workdir)
  model = loader.load_model(config, setup.rt, loader.REWARD)
  out = pathlib.Path(config.output or setup.workdir / "hf")
  files = reward_hf.save_reward_hf(model, out, dtype=config.dtype,
                                   tokenizer=setup.tokenizer_dir)
  summary = {"output": str(out), "files": files, "dtype": config.dtype}
  summary_lib.write_summary(setup.workdir / "export_rm.json", summary,
                       f"export_rm: {len(files)} safetensors file(s), {config.dtype}",
                       outputs={"HF sequence classifier": out})
  return summary
