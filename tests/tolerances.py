"""The tolerance of a tiny fp32 model's outputs compared across batch compositions.

XLA:CPU picks a matmul's blocking, and so the order of its float reductions, by the
operands' shapes and by the CPU's vector width (AVX2 or AVX-512): a row computed in a
batch of another size or padding, or by another program (the engine against one full
forward), is not bitwise the row computed alone. The difference is a few units in the
last place of the largest activations, accumulated over the model's depth; the tests'
logits, log-probabilities and scores are at most tens, so it stays far below BATCH_ATOL,
while a real error (a wrong position, mask, token or cache entry) moves them by far more.
Bitwise equality is for what the code guarantees: the same program on the same inputs
(docs/development.md, "Tests and the CPU kind")."""

BATCH_ATOL = 1e-4
