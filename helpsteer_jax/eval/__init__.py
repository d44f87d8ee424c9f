"""Evaluation: scoring eval sets with a reward model, metrics and reports."""
