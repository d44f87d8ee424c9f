"""An existing attribute model as an HF *ForSequenceClassification directory.

Reads the model as the scoring tasks do (`init.checkpoint`: an
attribute-model workdir or Orbax checkpoint; or `init.hf_path` with
`init.head=<head.npz>`) and writes what the attribute-model task writes to
`<workdir>/hf` at the end of training: `transformers`'
`AutoModelForSequenceClassification` loads it.
"""

from __future__ import annotations

import pathlib

import ml_collections

from helpsteer_jax.models import reward_hf
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.scoring import reward_model


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  reward_model.require_trained(config, "export_rm")
  setup = setup_lib.prepare(config, workdir)
  model = reward_model.build_reward_model(config, setup.rt)
  out = pathlib.Path(config.output or setup.workdir / "hf")
  files = reward_hf.save_reward_hf(model, out, dtype=config.dtype,
                                   tokenizer=setup.tokenizer_dir)
  summary = {"output": str(out), "files": files, "dtype": config.dtype}
  summary_lib.write_summary(setup.workdir / "export_rm.json", summary,
                       f"export_rm: {len(files)} safetensors file(s), {config.dtype}",
                       outputs={"HF sequence classifier": out})
  return summary
