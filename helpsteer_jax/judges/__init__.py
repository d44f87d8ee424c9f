"""Generative judges as text: their prompts, the parsers of their answers, the rule-based
rewards that train them (pure Python and NumPy, no JAX), and the client of a served one."""
