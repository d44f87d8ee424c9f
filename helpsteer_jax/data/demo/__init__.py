"""Deterministic demo data (no downloads), written in the formats `data.formats` reads.

`rows`: HelpSteer-format rows whose attributes follow from the text, and
HelpSteer2-Preference pairs of them (plus the rules that score a response);
`pairs_2d`: HelpSteer-2D pairs; `tokenizer`: a byte-level BPE trained on them.
"""

from helpsteer_jax.data.demo.pairs_2d import demo_pairs, write_demo_2d
from helpsteer_jax.data.demo.rows import (
    corpus,
    demo_rows,
    heldout_prompts,
    rule_correct,
    rule_scores,
    write_demo_dataset,
    write_demo_preference,
)
from helpsteer_jax.data.demo.tokenizer import build_demo_tokenizer

__all__ = [
    "build_demo_tokenizer", "corpus", "demo_pairs", "demo_rows", "heldout_prompts",
    "rule_correct", "rule_scores", "write_demo_2d", "write_demo_dataset",
    "write_demo_preference",
]
