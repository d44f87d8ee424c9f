"""Inference: KV-cache decoding, sampling, steering, best-of-n and reward-model scoring.

Attribute scorers (`attribute_scorer`: the texts -> [n, 9] interface and the
one loader of configured scorers) are used by best-of-n and by the
per-segment scoring of build_2d (`segment_scores`); `scoring` runs the
reward model itself over the mesh.
"""

from helpsteer_jax.inference.attribute_scorer import (
    AttributeScorer,
    DemoRuleScorer,
    MeshScorer,
    load_scorer,
)
from helpsteer_jax.inference.decode import Sampler
from helpsteer_jax.inference.generator import Generator
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.inference.scoring import RewardModelScorer
from helpsteer_jax.inference.segment_scores import score_pairs

__all__ = [
    "AttributeScorer", "DemoRuleScorer", "Generator", "MeshScorer",
    "RewardModelScorer", "Sampler", "SamplingConfig", "load_scorer", "score_pairs",
]
