"""2D-DPO and its baselines (DPO, IPO, 1D segment / aspect) on preference pairs.

Reads HelpSteer-2D JSONL or CSV (the built-in 2D demo pairs by default),
tokenizes each pair into a chosen and a rejected row with per-token segment
ids, gets the reference log-probs (a cached first pass, or on the fly in the
step), and trains the policy with the shared loop. The policy starts from
`init.source` (an HF directory or an AC-SFT run) or a fresh `model.name`.
The HF export's chat template steers `data.response_label`'s attributes (its
scores the defaults) when the pairs were trained under a label, else those
of the policy's source export.
"""

from __future__ import annotations

import ml_collections

from helpsteer_jax.runs import preference

RESUMES = True  # a rerun resumes the workdir's run (main.py checks its fingerprint)

batch_schema = preference.batch_schema
config_reads = preference.config_reads
abstract_train_step = preference.abstract_train_step


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  return preference.train(config, workdir)
