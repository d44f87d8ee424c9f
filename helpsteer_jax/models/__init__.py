"""The decoder, its model families, presets, and Hugging Face checkpoint conversion."""
