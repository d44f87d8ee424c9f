"""Generative judges as text: their prompts, the parsers of their answers and the
rule-based rewards that train them (pure Python and NumPy, no JAX)."""
