"""The OpenAI-compatible server: the HTTP API over the batching engine and the attribute model."""
