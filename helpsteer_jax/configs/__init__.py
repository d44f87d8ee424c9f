"""The task configs: one file per task, `get_config(preset)` and its `PRESETS`.

Run as `helpsteer-jax --config=<file name>[:preset]`; the repository's
`configs/` directory is this one.
"""
