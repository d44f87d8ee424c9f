"""Steering sweeps: does each attribute move the responses the way it is asked to?

A sweep asks for every value (0..4 by default) of each swept attribute in
turn, the other attributes at their defaults, on every prompt of a set.
`settings` lists those label choices, `sweep_requests` crosses them with the
prompts (settings outer, prompts inner), `generate_rows` answers them batch
by batch (resumable: `resume.append_batches`), optionally with the
attribute model's nine predictions of each response, and `summarize` turns
the rows into per-setting means: words, sentences (`data.segment`'s
segmenter), response tokens, the share stopped by `max_new_tokens`, and the
predicted attributes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Iterable, Mapping, Sequence

import numpy as np

from helpsteer_jax import resume
from helpsteer_jax.data import segment
from helpsteer_jax.data.records import ATTRIBUTES, MAX_SCORE, MIN_SCORE
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.generator import Generator
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.scoring.scorer import Scorer

DEFAULT_VALUES = tuple(range(MIN_SCORE, MAX_SCORE + 1))
LENGTH = "length"  # the finish reason of a response cut by max_new_tokens


@dataclasses.dataclass(frozen=True)
class Setting:
  """One label of the sweep: `attribute` at `value`, the rest of `attributes` at defaults."""

  attribute: str
  value: int
  attributes: Mapping[str, int]


def parse_attributes(spec: str, label: Sequence[str], key: str = "sweep.attributes"
                     ) -> tuple[str, ...]:
  """A comma-separated list of attribute names (canonical order), or `label` when empty."""
  if not spec.strip():
    return tuple(label)
  names = [n.strip() for n in spec.split(",") if n.strip()]
  unknown = [n for n in names if n not in ATTRIBUTES]
  if unknown:
    raise ConfigError(f"{key}={spec!r}: unknown attribute(s) {unknown}; choose from"
                      f" {', '.join(ATTRIBUTES)}")
  return tuple(n for n in ATTRIBUTES if n in names)


def parse_values(spec: str, key: str = "sweep.scores") -> tuple[int, ...]:
  """A comma-separated list of distinct scores in 0..4, in the order given."""
  values = []
  for part in (p.strip() for p in str(spec).split(",")):
    try:
      value = int(part)
    except ValueError:
      raise ConfigError(f"{key}={spec!r}: {part!r} is not an integer") from None
    if not MIN_SCORE <= value <= MAX_SCORE:
      raise ConfigError(f"{key}={spec!r}: {value} is outside {MIN_SCORE}..{MAX_SCORE}")
    if value in values:
      raise ConfigError(f"{key}={spec!r}: {value} is given twice")
    values.append(value)
  return tuple(values)


def settings(defaults: Mapping[str, int], attributes: Sequence[str],
             values: Sequence[int] = DEFAULT_VALUES) -> list[Setting]:
  """For each swept attribute, each value, the others at `defaults` (a swept attribute
  the defaults lack joins the label)."""
  return [Setting(name, int(v), steering.checked({**defaults, name: v}))
          for name in attributes for v in values]


def sweep_requests(prompts: Sequence[steering.Request], grid: Sequence[Setting]
                   ) -> list[steering.Request]:
  """Every prompt under every setting (settings outer): the prompt's attributes (the
  defaults, and a prompt file's per-row values) with the swept one set."""
  out = []
  for s in grid:
    for i, p in enumerate(prompts):
      extra = {**p.extra, "sweep_attribute": s.attribute, "sweep_value": s.value,
               "prompt_index": i}
      attributes = steering.checked({**p.attributes, s.attribute: s.value})
      out.append(dataclasses.replace(p, attributes=attributes, extra=extra))
  return out


def answer_rows(generator: Generator, batch: Sequence[steering.Request], max_new_tokens: int,
                sampling: SamplingConfig, seed: int, scorer: Scorer | None = None
                ) -> list[dict]:
  """One output row per request: the response, its finish reason and token count, and
  with `scorer` the nine predicted attributes (None where a response was not scored)."""
  completions = generator.complete([r.prompt_text() for r in batch], max_new_tokens,
                                   sampling=sampling, seed=seed)
  responses = [steering.response_text(c.text, c.finish_reason) for c in completions]
  rows = [req.output_row(text, finish_reason=c.finish_reason, tokens=len(c.token_ids))
          for req, text, c in zip(batch, responses, completions)]
  if scorer is not None:
    preds = scorer([req.answered(text) for req, text in zip(batch, responses)])
    for row, p in zip(rows, preds):
      row["predicted"] = None if np.isnan(p).any() else {
          name: round(float(x), 4) for name, x in zip(ATTRIBUTES, p)}
  return rows


def generate_rows(generator: Generator, requests: Sequence[steering.Request],
                  out_path: pathlib.Path, *, batch_size: int, max_new_tokens: int,
                  sampling: SamplingConfig, seed: int = 0, scorer: Scorer | None = None,
                  option: str = "the workdir") -> int:
  """Appends the rows of `requests` not yet in `out_path` (a batch's seed is `seed` + its
  first row, as the generate task's); returns how many were there already.

  A request whose model input an earlier one already has (the default value
  of one swept attribute is the same label as another's) is not generated
  again: its row is the earlier one's, with its own sweep fields.
  """
  source = same_input_sources(requests)
  answered: dict[int, dict] = {}  # rows by request index: this run's, then those on disk

  def answer(start: int, batch: Sequence[steering.Request]) -> list[dict]:
    indices = range(start, start + len(batch))
    own = [i for i in indices if source[i] == i]
    if own:
      rows = answer_rows(generator, [requests[i] for i in own], max_new_tokens, sampling,
                         seed + start, scorer)
      answered.update(zip(own, rows))
    return [answered[i] if source[i] == i else _copied_row(answered, source[i], requests[i],
                                                           out_path)
            for i in indices]

  return resume.append_batches(out_path, requests, steering.Request.matches, option,
                               batch_size, answer)


def read_rows(path: pathlib.Path) -> list[dict]:
  """The rows `generate_rows` wrote."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def same_input_sources(requests: Sequence[steering.Request]) -> list[int]:
  """Per request, the index of the first request with the same model input (itself if
  it is the first)."""
  first: dict[str, int] = {}
  return [first.setdefault(r.prompt_text(), i) for i, r in enumerate(requests)]


def _copied_row(answered: dict[int, dict], source: int, request: steering.Request,
                out_path: pathlib.Path) -> dict:
  """`request`'s row from the row of request `source`, generated in this run or, after a
  resume, read back from `out_path` (process 0 writes and so reads; elsewhere the row is
  not written)."""
  if source not in answered and out_path.exists():
    with open(out_path, encoding="utf-8") as f:
      answered.update((i, json.loads(line)) for i, line in enumerate(f) if i not in answered)
  base = answered.get(source, {})
  return {**base, **request.output_row(base.get("response", ""))}


def words(text: str) -> int:
  return len(text.split())


def sentences(text: str) -> int:
  """Sentence segments with any text in them."""
  return sum(1 for s in segment.segment_texts(text) if s.strip())


def _mean(xs: Iterable[float]) -> float | None:
  xs = list(xs)
  return float(np.mean(xs)) if xs else None


def _predicted_means(rows: Sequence[dict]) -> dict[str, float | None] | None:
  scored = [r["predicted"] for r in rows if r.get("predicted")]
  if not any("predicted" in r for r in rows):
    return None
  return {name: _mean(p[name] for p in scored) for name in ATTRIBUTES}


def summarize(rows: Sequence[dict], grid: Sequence[Setting]) -> dict:
  """Per swept attribute, per value: the measures of its rows (`generate_rows`' output).

  `sweeps[attribute]` lists the settings in value order: `value`, `attributes`
  (the label asked for), `responses`, `mean_words`, `mean_sentences`,
  `mean_tokens`, `length_share` (cut by max_new_tokens), and `predicted` (the
  mean of each of the nine predictions over the scored responses; None
  without an attribute model) with `unscored` (responses too long to score).
  """
  groups: dict[tuple[str, int], list[dict]] = {}
  for r in rows:
    groups.setdefault((r["sweep_attribute"], r["sweep_value"]), []).append(r)
  sweeps: dict[str, list[dict]] = {}
  for s in grid:
    group = groups.get((s.attribute, s.value), [])
    if not group:
      raise ConfigError(f"no generations for {s.attribute}={s.value}")
    predicted = _predicted_means(group)
    entry = {
        "value": s.value, "attributes": dict(s.attributes), "responses": len(group),
        "mean_words": _mean(words(r["response"]) for r in group),
        "mean_sentences": _mean(sentences(r["response"]) for r in group),
        "mean_tokens": _mean(r["tokens"] for r in group),
        "length_share": _mean(r["finish_reason"] == LENGTH for r in group),
        "predicted": predicted,
    }
    if predicted is not None:
      entry["unscored"] = sum(1 for r in group if not r.get("predicted"))
      entry["abs_error"] = _mean(abs(r["predicted"][s.attribute] - s.value)
                                 for r in group if r.get("predicted"))
    sweeps.setdefault(s.attribute, []).append(entry)
  return {"attributes": list(sweeps), "values": sorted({s.value for s in grid}),
          "sweeps": sweeps}


def adherence(summary: dict) -> dict[str, float | None]:
  """Per swept attribute, the mean absolute error of its predictions to the requested
  values over every value and response (each value weighted by its responses), and
  their mean over attributes as `mean`; None without predictions."""
  out: dict[str, float | None] = {}
  for name, entries in summary["sweeps"].items():
    pairs = [(e["abs_error"], e["responses"] - e["unscored"]) for e in entries
             if e.get("abs_error") is not None]
    total = sum(n for _, n in pairs)
    out[name] = sum(x * n for x, n in pairs) / total if total else None
  known = [v for v in out.values() if v is not None]
  out["mean"] = float(np.mean(known)) if known else None
  return out


def series(summary: dict, attribute: str, measure: str) -> tuple[list[int], list[float]]:
  """(requested values, measure) of one swept attribute; `measure` is a key of a setting
  or `predicted` (that attribute's own prediction). Missing values are NaN."""
  entries = summary["sweeps"][attribute]
  xs = [e["value"] for e in entries]
  if measure == "predicted":
    ys = [(e["predicted"] or {}).get(attribute) for e in entries]
  else:
    ys = [e[measure] for e in entries]
  return xs, [math.nan if y is None else float(y) for y in ys]
