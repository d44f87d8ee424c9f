"""Records -> tokens -> training examples.

`tokenize` (template pieces -> ids + loss mask, truncation, and the
`FeatureReport` every featurizer returns) feeds one featurizer per kind of
batch: `next_token` (AC-SFT), `rm` (regression and Bradley-Terry reward
models) and `pair_rows` (2D-DPO / DPO pairs). Their examples are the
featurizer fields of the schemas in `data.batches`.
"""
