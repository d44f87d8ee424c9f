"""File formats -> records: every reader of the project, one module per format.

`rows` (sources, JSON lines / parquet / hub rows, bad-row handling) is shared
by `helpsteer` (HelpSteer / HelpSteer2 rows, NeMo SteerLM conversations),
`preference` (HelpSteer2-Preference,
RewardBench) and `helpsteer_2d` (HelpSteer-2D JSONL / CSV, plain pairs).
`task_source` reads a task's configured source with one of them or with
`tfds_helpsteer2` (the TFDS builder), which it imports only when asked: it
loads tensorflow-datasets.
"""
