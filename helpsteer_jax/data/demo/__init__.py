"""Deterministic demo data (no downloads), written in the formats `data.formats` reads.

`rows`: HelpSteer-format rows whose attributes follow from the text, and
HelpSteer2-Preference pairs of them (plus the rules that score a response);
`pairs_2d`: HelpSteer-2D pairs; `tokenizer`: a byte-level BPE trained on them.
"""
