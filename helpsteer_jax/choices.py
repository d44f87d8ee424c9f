"""The names a config chooses among, one table each, loaded without JAX: the registries
and the checks read them, and `--help` lists them, so that neither can go stale.

A registry's table maps each name to "package.module:attribute" (`registry.LazyRegistry`
imports the entry when a run first asks for it); a plain choice is a tuple of names.
"""

from __future__ import annotations

# `algorithm` (rl): `rl.algorithms.REGISTRY`. A new algorithm is a module there and a line here.
RL_ALGORITHMS = {
    "rloo": "helpsteer_jax.rl.algorithms.rloo:RLOO",
    "grpo": "helpsteer_jax.rl.algorithms.grpo:GRPO",
    "ppo": "helpsteer_jax.rl.algorithms.ppo:PPO",
    "gspo": "helpsteer_jax.rl.algorithms.gspo:GSPO",
    "dapo": "helpsteer_jax.rl.algorithms.dapo:DAPO",
    "distill": "helpsteer_jax.rl.algorithms.distill:Distill",
}

# `loss.loss_type` (dpo2d: `losses.dpo2d`); the sequence losses read whole responses'
# log-ratios, no segment scores (iterative_dpo's sampled pairs take only these).
PREFERENCE_LOSSES = ("dpo2d", "dpo", "ipo", "dpo1d_segment", "dpo1d_aspect")
SEQUENCE_LOSSES = ("dpo", "ipo")

# `loss` (attribute_model): the regression model or a Bradley-Terry variant (`losses.bt`).
BT_VARIANTS = ("regular_bt", "margin_bt", "scaled_bt")
ATTRIBUTE_LOSSES = ("regression",) + BT_VARIANTS

# `scorer.source` by name (besides a model's path, a server's URL or a user's factory:
# `scoring.load`), each with what it is.
DEMO_RULES = "demo_rules"
GENRM_VERIFIER = "genrm_verifier"
PRINCIPLE_VERIFIER = "principle_verifier"
SCORER_SOURCES = {
    DEMO_RULES: "the demo data's rules, no trained model needed",
    GENRM_VERIFIER: "a GenRM's answers checked against their prompts' references: the"
                    " reward that trains a GenRM",
    PRINCIPLE_VERIFIER: "the reward that trains a principle judge, rl only",
}

# `scorer.judge`: each generative judge and what decodes its answers on the mesh
# (`scoring.load.JUDGES`, a layer above the scorers).
GENRM_JUDGE = "genrm"
PRINCIPLE_JUDGE = "principle"
JUDGES = {
    GENRM_JUDGE: "helpsteer_jax.inference.judge:load_genrm",
    PRINCIPLE_JUDGE: "helpsteer_jax.inference.principle_reasoning:ReasoningJudge",
}
