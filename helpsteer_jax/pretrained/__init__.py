"""Real pretrained models shipped inside PyPI packages, built into HF directories offline."""
