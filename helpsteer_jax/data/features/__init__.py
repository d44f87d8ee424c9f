"""Records -> tokens -> training examples.

`tokenize` (template pieces -> ids + loss mask, truncation, and the
`FeatureReport` every featurizer returns) feeds one featurizer per kind of
batch: `next_token` (AC-SFT), `rm` (regression and Bradley-Terry reward
models) and `pair_rows` (2D-DPO / DPO pairs). Their examples are the
featurizer fields of the schemas in `data.batches`.
"""

from helpsteer_jax.data.features.next_token import next_token_features, sft_features
from helpsteer_jax.data.features.pair_rows import pair_features
from helpsteer_jax.data.features.rm import (
    RegressionTokenizer,
    bt_features,
    label_vector,
    regression_features,
)
from helpsteer_jax.data.features.tokenize import (
    FeatureReport,
    TokenizedExample,
    tokenize_pieces,
    truncate,
)

__all__ = [
    "FeatureReport", "RegressionTokenizer", "TokenizedExample", "bt_features", "label_vector",
    "next_token_features", "pair_features", "regression_features", "sft_features",
    "tokenize_pieces", "truncate",
]
