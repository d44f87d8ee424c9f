"""The prompts an online task answers: a JSONL of `{"prompt", "attributes"?}` rows
(HelpSteer2's rows included, each prompt once), a text file, the demo's prompt
generator, or HelpSteer3's files as judge prompts: `prompts.format=genrm`, the preference
rows as GenRM prompts (`runs.genrm_prompts`), `prompts.format=principle`, the principle
rows as the principle judge's prompts (`judges.principle.prompt_row`, no attribute label:
a judgement is not steered), each with the human labels as its `reference`; with the
run's attribute values or random ones, tokenized, and those too long for a row left out
(RL's rollouts, iterative DPO's rounds). A GenRM's verifier reward needs each prompt's
`reference`: checked here, before anything compiles. A bad row of any of these files
raises a `DataError` naming its file and line, or with `data.on_bad_record=skip` is
skipped and counted in the task's `BadRecordReport`."""

from __future__ import annotations

import os
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.data.formats import helpsteer3
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import steering
from helpsteer_jax.judges import genrm, principle
from helpsteer_jax.rl import multiturn
from helpsteer_jax.rl.rollout import Prompt
from helpsteer_jax.runs import genrm_prompts
from helpsteer_jax.scoring import genrm as genrm_scoring

DEMO_TRAIN_SEED = 20_000  # the demo generator's seed for RL prompts (not the held-out one)
PRINCIPLE_FORMAT = "principle"
FORMATS = ("jsonl", "genrm", PRINCIPLE_FORMAT)


def on_bad_record(config) -> str:
  """`data.on_bad_record`, what the prompt readers do with a bad row."""
  return config.data.on_bad_record


def principle_requests(config, which: str, report: BadRecordReport | None = None
                       ) -> list[steering.Request]:
  """HelpSteer3 principle rows as judge prompts: the train prompts from
  `prompts.train_path`, the eval ones from `prompts.eval_path` or else the same source,
  split "validation" (a directory's; a file is read whole)."""
  pc = config.prompts
  path = pc.train_path if which == "train" else (pc.eval_path or pc.train_path)
  if not path:
    raise ConfigError(f"prompts.format={PRINCIPLE_FORMAT} reads HelpSteer3's principle"
                      " config: set --config.prompts.train_path to the dataset's directory,"
                      " its principle/ directory or a principle .jsonl(.gz) file")
  records = helpsteer3.read_helpsteer3(
      path, "principle", "train" if which == "train" else "validation",
      domains=helpsteer3.filter_list(pc.domains), languages=helpsteer3.filter_list(pc.languages),
      on_bad_record=on_bad_record(config), report=report)
  out = []
  for r in records:
    row = principle.prompt_row(r)
    prompt = row.pop("prompt")
    out.append(steering.make_request(prompt, {}, pc.system, row))
  return out


def read_requests(path: str, which: str, attributes: dict, config,
                  report: BadRecordReport | None = None) -> list[steering.Request]:
  """The train or eval prompts (`path`, else the demo's), each prompt once; bad rows per
  `data.on_bad_record` (skipped ones counted in `report`)."""
  pc = config.prompts
  fmt = pc.get("format", "jsonl")
  if fmt not in FORMATS:
    raise ConfigError(f"prompts.format={fmt!r}: one of {', '.join(FORMATS)}")
  if fmt == PRINCIPLE_FORMAT:
    return principle_requests(config, which, report)
  if fmt == "genrm":
    return _genrm_requests(path, which, attributes, config, report)
  if path:
    requests = steering.read_requests(path, attributes, pc.system,
                                      on_bad_record=on_bad_record(config), report=report)
    seen, unique = set(), []
    for r in requests:  # HelpSteer2 rows repeat each prompt once per response
      key = (r.prompt, r.follow_ups, tuple(sorted(r.attributes.items())))
      if key not in seen:
        seen.add(key)
        unique.append(r)
    return unique
  texts = (demo_rows.heldout_prompts(pc.demo_train_prompts, DEMO_TRAIN_SEED)
           if which == "train" else demo_rows.heldout_prompts())
  return [steering.make_request(t, attributes, pc.system) for t in texts]


def _genrm_requests(path: str, which: str, attributes: dict, config,
                    report: BadRecordReport | None = None) -> list[steering.Request]:
  """GenRM judge prompts from HelpSteer3 files: the train split of `train_path`, the
  validation split of `eval_path` (else of `train_path`)."""
  pc = config.prompts
  source = path or (pc.train_path if which == "eval" else "")
  if not source or not os.path.exists(os.path.expanduser(source)):
    raise ConfigError(f"prompts.format=genrm reads HelpSteer3's preference config, and"
                      f" prompts.train_path={source!r} is not there: give the dataset's"
                      " directory (the demo's is written by python -m"
                      " helpsteer_jax.runs.genrm_prompts workdir/genrm_demo)")
  return genrm_prompts.read_requests(
      source, "train" if which == "train" else "validation", attributes, pc.system,
      guidelines=bool(pc.genrm_guidelines), both_orders=bool(pc.genrm_both_orders),
      feedback_path=pc.feedback_path, domains=helpsteer3.filter_list(pc.domains),
      languages=helpsteer3.filter_list(pc.languages), on_bad_record=on_bad_record(config),
      report=report)


def check_references(requests: list[steering.Request], path: str, which: str) -> None:
  """Every request carries a valid GenRM `reference` (the verifier's labels); ConfigError
  naming the prompts and a DataError-style location for a malformed one."""
  missing = [r for r in requests if r.extra.get("reference") is None]
  if missing:
    raise ConfigError(f"scorer.source={genrm_scoring.VERIFIER} checks each answer against"
                      f" its prompt's reference, and {len(missing)} of {len(requests)}"
                      f" {which} prompts ({path or 'the demo prompts'}) carry none: use"
                      " prompts.format=genrm (HelpSteer3 files) or JSONL rows"
                      " {\"prompt\", \"reference\": {\"scores\": [h1, h2], \"ranking\": z}}")
  for i, r in enumerate(requests):
    try:
      genrm.check_reference(r.extra["reference"])
    except ValueError as e:
      where = r.conversation.source or f"{path}: prompt {i + 1}"
      raise ConfigError(f"{where}: {e}") from None


def _sampled_attributes(requests: list[steering.Request], names: str, seed: int,
                        salt: int) -> None:
  """Draws each request's values of `names` (0..4) from (seed, salt, its index)."""
  chosen = steering.attribute_names(names)
  for i, r in enumerate(requests):
    rng = np.random.default_rng([seed, salt, i])
    r.attributes = steering.checked({**r.attributes, **{
        n: int(rng.integers(0, 5)) for n in chosen}})


def read_prompts(config: ml_collections.ConfigDict, attributes: dict, tokenizer: Any,
                 add_bos: bool, max_prompt: int, which: str, multi_turn: int = 0,
                 report: BadRecordReport | None = None) -> list[Prompt]:
  """The train or eval prompts, tokenized (`Request.prompt_ids`); those over `max_prompt`
  tokens are dropped. `multi_turn`: answers of at most this many tokens to every user turn
  (`rl.multiturn.dialogue`), the follow-ups' worst case counted in the prompt's length;
  0: one answer each (a row's follow-ups unanswered). Bad rows: `read_requests`."""
  pc = config.prompts
  path = pc.train_path if which == "train" else pc.eval_path
  requests = read_requests(path, which, attributes, config, report)
  if multi_turn:
    requests = [multiturn.dialogue(r) for r in requests]
  elif any(r.follow_ups for r in requests):
    logging.warning("%s prompts: %d have follow-up turns, which one answer leaves unasked;"
                    " set rollout.multi_turn=true to answer them", which,
                    sum(bool(r.follow_ups) for r in requests))
  if which == "eval" and pc.eval_limit:
    requests = requests[:pc.eval_limit]
  if config.scorer.source == genrm_scoring.VERIFIER:
    check_references(requests, path, which)
  if pc.sample_attributes:
    _sampled_attributes(requests, pc.sample_attributes, config.seed, 0 if which == "train" else 1)
  prompts = [Prompt(r, r.prompt_ids(tokenizer, add_bos)) for r in requests]
  kept = [p for p in prompts if len(p.ids) + (
      multiturn.follow_up_tokens(p.request, tokenizer, multi_turn) if multi_turn else 0)
      <= max_prompt]
  if len(kept) < len(prompts):
    logging.warning("%s prompts: %d of %d are longer than %d tokens (train.seq_len -"
                    " rollout.max_new_tokens; with multi-turn, with every later turn and"
                    " its longest answer) and are left out", which,
                    len(prompts) - len(kept), len(prompts), max_prompt)
  if which == "train" and not kept:
    raise ConfigError(f"no training prompt fits in {max_prompt} tokens: raise train.seq_len"
                      " or lower rollout.max_new_tokens")
  return kept
