"""File formats -> records: every reader of the project, one module per format.

`rows` (sources, JSON lines / parquet / hub rows, bad-row handling) is shared
by `helpsteer` (HelpSteer / HelpSteer2 rows, NeMo SteerLM conversations),
`preference` (HelpSteer2-Preference,
RewardBench) and `helpsteer_2d` (HelpSteer-2D JSONL / CSV, plain pairs).
`task_source` reads a task's configured source with one of them or with
`tfds_helpsteer2` (the TFDS builder), which it imports only when asked: it
loads tensorflow-datasets.
"""

from helpsteer_jax.data.formats.helpsteer import (
    FORMATS,
    helpsteer_conversation,
    read_helpsteer,
    read_records,
    read_steerlm_conversations,
)
from helpsteer_jax.data.formats.helpsteer_2d import (
    ASPECTS_2D,
    CSV_ASPECTS,
    PlainPair,
    ScoredPair,
    ScoredResponse,
    read_2d,
    read_plain_pairs,
    write_2d,
)
from helpsteer_jax.data.formats.preference import (
    PreferencePair,
    read_helpsteer2_preference,
    read_rewardbench,
)
from helpsteer_jax.data.formats.rows import (
    BadRecord,
    BadRecordReport,
    iter_json_lines,
    resolve_source,
)
from helpsteer_jax.data.formats.task_source import load_conversations

__all__ = [
    "ASPECTS_2D", "BadRecord", "BadRecordReport", "CSV_ASPECTS", "FORMATS", "PlainPair",
    "PreferencePair", "ScoredPair", "ScoredResponse", "helpsteer_conversation",
    "iter_json_lines", "load_conversations", "read_2d", "read_helpsteer",
    "read_helpsteer2_preference", "read_plain_pairs", "read_records", "read_rewardbench",
    "read_steerlm_conversations", "resolve_source", "write_2d",
]
