"""Data: readers, the SteerLM template, tokenization, packing, pipelines."""
