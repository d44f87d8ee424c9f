"""The OpenAI-compatible server: the HTTP API over the batching engine and the attribute model."""

from helpsteer_jax.serve import app, backend, protocol

__all__ = ["app", "backend", "protocol"]
