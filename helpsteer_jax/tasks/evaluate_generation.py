"""MT-Bench: answer the 80 two-turn questions with the run's attributes, then grade.

Everything that can be checked is checked before the model loads: the
question, reference and judge-prompt files (file:line errors), the
attributes, and the judge (an OpenAI-compatible endpoint must answer and
serve the judge model; an attribute model's path must exist). Answers go to
`answers.jsonl` (resumable, FastChat's model-answer format), grades to
`judgments.jsonl`, and the per-category table to `mt_bench.{json,md,png}`.
LLM judging runs on process 0; the attribute model scores on the mesh.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib

import ml_collections

from helpsteer_jax import multihost, processes, weights
from helpsteer_jax.config_reads import Reads
from helpsteer_jax.errors import ConfigError, EvaluationError, HelpsteerError
from helpsteer_jax.eval import mt_bench_data, mt_bench_grading, mt_bench_judgments, mt_bench_report
from helpsteer_jax.eval.mt_bench_answers import answer_all
from helpsteer_jax.inference import steering
from helpsteer_jax.judges.client import JudgmentCache, OpenAIJudge
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.runs.generation import build_generator, sampling_config
from helpsteer_jax.scoring import load, remote, rewards, rules

RESUMES = True  # a rerun resumes the workdir's run (main.py checks its fingerprint)

JUDGES = ("openai", "attribute_model", "none")


def config_reads() -> list:
  """The LLM judge's keys for judge.kind=openai, the scorer's for attribute_model."""
  return [Reads(("judge.base_url", "judge.model", "judge.api_key_env", "judge.timeout",
                 "judge.max_retries", "judge.parallel", "judge.max_tokens"),
                "judge.kind", "openai", lambda c: c.judge.kind == "openai"),
          Reads(("scorer",), "judge.kind", "attribute_model",
                lambda c: c.judge.kind == "attribute_model"),
          *load.scorer_reads()]


class JudgingIncomplete(HelpsteerError):
  """Some judge requests failed after their retries (the rest is written)."""


def selected_questions(config: ml_collections.ConfigDict) -> tuple[list, dict]:
  """The configured questions (with their references) and, for an LLM judge, its prompts."""
  files = mt_bench_data.MtBenchFiles.from_config(config.mt_bench)
  questions = mt_bench_data.read_questions(files.questions)
  if config.mt_bench.question_ids:
    try:
      wanted = [int(x) for x in str(config.mt_bench.question_ids).split(",") if x.strip()]
    except ValueError:
      raise ConfigError(f"mt_bench.question_ids={config.mt_bench.question_ids!r}: give"
                        " comma-separated integers") from None
    by_id = {q.question_id: q for q in questions}
    missing = [i for i in wanted if i not in by_id]
    if missing:
      raise ConfigError(f"mt_bench.question_ids: {missing} not in {files.questions}")
    questions = [by_id[i] for i in wanted]
  prompts = {}
  if config.judge.kind == "openai":
    if not files.judge_prompts:
      raise ConfigError("the openai judge needs FastChat's judge_prompts.jsonl: set"
                        " --config.mt_bench.judge_prompts")
    prompts = mt_bench_data.read_judge_prompts(files.judge_prompts)
    questions = mt_bench_data.with_references(questions, files)
  return questions, prompts


def _openai_judge(config: ml_collections.ConfigDict) -> OpenAIJudge:
  j = config.judge
  if not j.base_url:
    raise ConfigError("judge.kind=openai needs --config.judge.base_url (e.g."
                      " https://api.openai.com/v1), or --config.judge.kind=attribute_model|none")
  return OpenAIJudge(j.base_url, j.model, j.api_key_env, int(j.max_retries), float(j.timeout),
                     max_tokens=int(j.max_tokens))


def _check_judge(config: ml_collections.ConfigDict) -> None:
  kind = config.judge.kind
  if kind not in JUDGES:
    raise ConfigError(f"judge.kind={kind!r}; choose one of {', '.join(JUDGES)}")
  if kind == "openai":
    multihost.on_primary(lambda: _openai_judge(config).check())
  elif kind == "attribute_model":
    source = config.scorer.source
    if not source:
      raise ConfigError("judge.kind=attribute_model needs --config.scorer.source=<attribute_model"
                        " workdir, its HF export, or a serve URL http://host:port/v1>")
    def check_path() -> None:  # decided on process 0: every process stops or none
      if not (remote.is_url(source) or source == rules.DEMO_RULES or load.is_factory(source)
              or pathlib.Path(source).exists()):
        raise ConfigError(f"scorer.source={source}: no such directory")
    multihost.on_primary(check_path)
    rewards.weight_vector(config.scorer.weights.to_dict())


def _write_jsonl(path: pathlib.Path, rows: list[dict]) -> None:
  tmp = path.with_suffix(".tmp")
  tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  os.replace(tmp, path)


def _read_answers(path: pathlib.Path) -> dict[int, dict]:
  rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
  return {r["question_id"]: r for r in rows}


def _judge(config, questions, prompts, answers, setup, workdir, model_id):
  """Judgment rows on process 0 (None elsewhere) and the number of failed requests."""
  if config.judge.kind == "openai":
    graded = {}

    def grade():
      outcome = mt_bench_judgments.llm_judgments(
          questions, answers, prompts, _openai_judge(config),
          JudgmentCache(workdir / "judge_cache.jsonl"), model_id, int(config.judge.parallel))
      for f in outcome.failures[:5]:
        print(f"evaluate_generation: judging question {f['question_id']} turn {f['turn']}"
              f" failed: {f['error']}")
      _write_jsonl(workdir / "judgments.jsonl", outcome.rows)
      graded["rows"] = outcome.rows
      return {"failed": len(outcome.failures), "asked": outcome.asked}

    info = multihost.on_primary(grade)
    return graded.get("rows"), info
  scorer = load.load_scorer(config.scorer, setup.rt)
  outcome = mt_bench_judgments.attribute_judgments(
      questions, answers, scorer, rewards.weight_vector(config.scorer.weights.to_dict()),
      config.system, model_id, f"attribute_model:{config.scorer.source}")
  if processes.is_primary():
    _write_jsonl(workdir / "judgments.jsonl", outcome.rows)
  return outcome.rows, {"failed": 0, "asked": 0}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  workdir = pathlib.Path(workdir)
  if config.batch_size < 1 or config.max_new_tokens < 1:
    raise ConfigError("batch_size and max_new_tokens must be at least 1")
  questions, prompts = selected_questions(config)
  attributes = steering.run_attributes(config, weights.steer_spec(config))
  sampling = sampling_config(config)
  _check_judge(config)
  model_id = config.model_id or workdir.resolve().name

  setup = setup_lib.prepare(config, workdir, tokenizer=False, model=False)
  generator = build_generator(config, setup.rt, workdir, max_batch=config.batch_size)
  answers_path = workdir / "answers.jsonl"
  done = answer_all(generator, questions, attributes, config.system, answers_path,
                    model_id=model_id, max_new_tokens=config.max_new_tokens,
                    batch_size=config.batch_size, sampling=sampling,
                    per_category=bool(config.sampling.fastchat_temperatures), seed=config.seed)
  del generator
  gc.collect()
  answers = multihost.on_primary(lambda: {str(k): v for k, v in
                                          _read_answers(answers_path).items()})
  answers = {int(k): v for k, v in answers.items()}
  summary = {"model_id": model_id, "questions": len(questions), "already_answered": done,
             "attributes": attributes, "judge": config.judge.kind}
  if config.judge.kind == "none":
    summary_lib.write_summary(workdir / "mt_bench.json", summary,
                         f"evaluate_generation: answered {len(questions)} questions",
                         outputs={"answers": answers_path})
    return summary

  rows, info = _judge(config, questions, prompts, answers, setup, workdir, model_id)
  if processes.is_primary():
    table = mt_bench_report.score_table(rows, info["failed"])
    score_name = "reward" if config.judge.kind == "attribute_model" else "score"
    md = mt_bench_report.markdown(table, score_name)
    (workdir / "mt_bench.md").write_text(md, encoding="utf-8")
    mt_bench_report.plot(table, workdir / "mt_bench.png", f"MT-Bench, {model_id}", score_name)
    summary.update(table=table, judge_requests=info["asked"])
    summary_lib.write_summary(workdir / "mt_bench.json", summary,
                         mt_bench_report.show_result(table, model_id), md,
                         outputs={"answers": answers_path,
                                  "judgments": workdir / "judgments.jsonl",
                                  "table": workdir / "mt_bench.md",
                                  "plot": workdir / "mt_bench.png"})
  if not info["failed"] and multihost.on_primary(lambda: bool(rows) and all(
      r["score"] == mt_bench_grading.UNPARSED for r in rows)):
    why = (load.unscored_cause(config.scorer) if config.judge.kind == "attribute_model"
           else f"no reply of judge.model={config.judge.model} holds a [[rating]]")
    raise EvaluationError(f"evaluate_generation: none of the {len(questions)} questions'"
                          f" answer turns was judged (mt_bench.json: unparsed): {why}")
  if info["failed"]:
    raise JudgingIncomplete(f"{info['failed']} judge requests failed after"
                            f" {config.judge.max_retries} retries (see the lines above); the"
                            " judged rest is written: rerun the same command to ask them again")
  return summary
