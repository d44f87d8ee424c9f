"""Attribute scoring: conversations -> [n, 9] predictions of the nine SteerLM attributes.

`scorer.Scorer` is the one protocol; `load.load_scorer` turns a configured
source (an attribute-model run, its HF export, a server URL, the demo rules
or a user's factory) into one; `rewards` weighs predictions into a scalar.
"""
