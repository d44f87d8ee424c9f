"""The decoder, its model families, the catalog of named model shapes, and Hugging Face
checkpoint conversion."""
