"""Data: records and the SteerLM format, file formats, features, batches, demo data.

Layers (imports point down):
  records, template, segment   the records, the one SteerLM formatter, the sentence
                               segmenter: shared by readers, featurizers and inference
  formats/                     files -> records (bad rows: DataError or skip-and-count)
  features/                    records -> tokens -> examples (+ a FeatureReport)
  batches                      each task's batch, declared once
  pipeline                     examples -> packed / padded global batches (grain;
                               imported on its own, it loads grain)
  demo/                        demo files in the formats above, and the demo tokenizer
"""
