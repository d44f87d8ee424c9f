"""ExPO: extrapolate a trained model away from its start, theta_1 + alpha (theta_1 - theta_0).

  helpsteer-jax --config=configs/attribute_model.py                   # regression RM
  helpsteer-jax --config=configs/attribute_model.py:demo_scaled_bt    # scaled BT from it
  helpsteer-jax --config=configs/expo.py                              # ExPO of the BT RM
  helpsteer-jax --config=configs/expo.py --config.expo.base=/runs/acsft/hf \
      --config.expo.tuned=/runs/dpo2d --config.expo.alpha=0.1,0.3,0.5 --workdir=/runs/expo

`expo.base` (theta_0, where training started) and `expo.tuned` (theta_1) are
each a training task's Orbax run directory (acsft, dpo2d, rl, attribute_model,
...) or an HF directory (causal LM or attribute model); policy or reward model
is detected from them. `expo.alpha` is one alpha or a comma list; each is
written to `<workdir>/alpha_<alpha>/` as an Orbax params checkpoint and an HF
directory (`hf/`; a reward model also `head.npz`). `model.name` gives the
family of Orbax sources (their shapes are read from them).
Presets: `demo` (the demo regression RM -> its scaled-BT run, alpha 0.1, 0.3, 0.5).
"""

import ml_collections

from helpsteer_jax import config_base

PRESETS = ("demo",)
RENAMED = {"init": "removed: ExPO reads two models, expo.base (theta_0) and expo.tuned"
                   " (theta_1)", "model.preset": "model.name"}


def get_config(preset: str = ""):
  config = config_base.base_config("expo")
  del config.init  # the two sources are expo.base and expo.tuned
  config.expo = ml_collections.ConfigDict(dict(
      base="workdir/attribute_model",      # theta_0: where expo.tuned started
      tuned="workdir/attribute_model_bt",  # theta_1: the trained model
      alpha="0.1,0.3,0.5",  # one alpha or a comma list: one output per alpha
      hf_dtype="",          # dtype of the HF output; "" = expo.tuned's saved dtype
      export_hf=True))      # also write hf/ (a head with a bias has no HF form)
  if preset in ("", "demo"):
    return config
  raise config_base.unknown_preset("expo", preset, PRESETS)
