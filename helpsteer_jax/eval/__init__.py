"""Evaluation: scoring eval sets with a reward model, metrics and reports."""

from helpsteer_jax.eval.rm_eval import evaluate_attributes, evaluate_pairs, score_conversations
from helpsteer_jax.eval.rm_metrics import (
    STEERLM_RM_WEIGHTS,
    attribute_metrics,
    pairwise_accuracy,
    rewardbench_sections,
)
from helpsteer_jax.eval.rm_report import attribute_table, pairs_table, plot_attributes

__all__ = [
    "STEERLM_RM_WEIGHTS", "attribute_metrics", "attribute_table", "evaluate_attributes",
    "evaluate_pairs", "pairs_table", "pairwise_accuracy", "plot_attributes",
    "rewardbench_sections", "score_conversations",
]
