"""Generative judges: their prompts, answer parsers and rule-based rewards."""
