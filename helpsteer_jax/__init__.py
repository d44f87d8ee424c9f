"""helpsteer-jax: SteerLM and 2D-DPO on HelpSteer data in JAX / Flax NNX."""

__version__ = "0.1.0"
