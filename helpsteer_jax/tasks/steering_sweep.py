"""Steering sweeps: each swept attribute at each value, the others at their defaults.

The model, its tokenizer, the label's attributes and their defaults, decoding
and the prompt-file formats are the generate task's. Prompts come from
`input`, MT-Bench's first turns (`mt_bench.questions`) or the held-out demo
prompts. Bad settings and malformed prompts fail before the model is loaded.
`sweep_generations.jsonl` gets one row per setting x prompt, appended batch
by batch and resumed after a kill as generate's output is (process 0 decides
where to resume and writes); then process 0 reads it back and writes
`sweep.json`, `sweep.md` and `sweep.png` (`eval.sweep_report`), so the
reports describe exactly the rows on disk.
"""

from __future__ import annotations

import pathlib
import time

import ml_collections

from helpsteer_jax import processes, runtime, weights
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.eval import mt_bench_data, sweep_report
from helpsteer_jax.eval import steering_sweep as sweep_lib
from helpsteer_jax.inference import steering
from helpsteer_jax.runs import generation
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.scoring.load import load_scorer, scorer_reads
from helpsteer_jax.scoring.scorer import Scorer

RESUMES = True  # a rerun resumes the workdir's run (main.py checks its fingerprint)


def config_reads() -> list:
  """The scorer kind's keys."""
  return scorer_reads()

GENERATIONS_FILE = "sweep_generations.jsonl"


def read_prompts(config: ml_collections.ConfigDict, defaults: dict[str, int]
                 ) -> tuple[list[steering.Request], str]:
  """(the prompts, where they come from): `input`, MT-Bench's first turns or the demo
  prompts, the first `prompt_limit` of them."""
  mt = config.mt_bench
  if config.prompt_limit < 0:
    raise ConfigError(f"prompt_limit={config.prompt_limit}: give 0 (all) or a positive count")
  if mt.questions or mt.dir:
    if config.input:
      raise ConfigError("set either --config.input or --config.mt_bench.questions"
                        " (--config.mt_bench.dir), not both")
    path = mt_bench_data.MtBenchFiles.from_config(mt).questions
    prompts = [steering.make_request(q.turns[0], defaults, config.system,
                                     {"question_id": q.question_id, "category": q.category})
               for q in mt_bench_data.read_questions(path)]
    source = f"MT-Bench first turns ({path})"
  else:
    prompts = generation.read_input(config, defaults)
    source = config.input or "held-out demo prompts"
  return prompts[:config.prompt_limit or None], source


def sweep_scorer(config: ml_collections.ConfigDict, rt: runtime.Runtime) -> Scorer | None:
  """`config.scorer`'s (None when `scorer.source` is empty: no predictions)."""
  return load_scorer(config.scorer, rt) if config.scorer.source else None


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  workdir = pathlib.Path(workdir)
  if config.batch_size < 1 or config.max_new_tokens < 1:
    raise ConfigError("batch_size and max_new_tokens must be at least 1")
  values = sweep_lib.parse_values(config.sweep.scores)
  defaults = steering.run_attributes(config, weights.steer_spec(config))
  swept = sweep_lib.parse_attributes(config.sweep.attributes, tuple(defaults))
  grid = sweep_lib.settings(defaults, swept, values)
  prompts, source = read_prompts(config, defaults)
  requests = sweep_lib.sweep_requests(prompts, grid)
  sampling = generation.sampling_config(config)

  setup = setup_lib.prepare(config, workdir, tokenizer=False, model=False)
  scorer = sweep_scorer(config, setup.rt)
  generator = generation.build_generator(config, setup.rt, workdir)
  out_path = workdir / GENERATIONS_FILE
  start = time.perf_counter()
  done = sweep_lib.generate_rows(
      generator, requests, out_path, batch_size=config.batch_size,
      max_new_tokens=config.max_new_tokens, sampling=sampling, seed=config.seed,
      scorer=scorer, option="--workdir")
  seconds = time.perf_counter() - start
  distinct = len(set(sweep_lib.same_input_sources(requests)))
  result = {"settings": len(grid), "prompts": len(prompts), "rows": len(requests),
            "distinct_inputs": distinct, "already_written": done, "seconds": seconds,
            "output": str(out_path)}
  if not processes.is_primary():
    return result
  summary = {
      "model": config.init.source or config.model.name,
      "prompt_source": source, "prompts": len(prompts), "defaults": defaults,
      "sampling": config.sampling.to_dict(), "max_new_tokens": config.max_new_tokens,
      "scorer": config.scorer.source or None,
      **sweep_lib.summarize(sweep_lib.read_rows(out_path), grid)}
  paths = sweep_report.write(summary, workdir, f"Steering sweep: {summary['model']}")
  print(f"steering_sweep: {len(grid)} settings x {len(prompts)} prompts"
        f" ({distinct} distinct model inputs) in {seconds:.1f}s ({done} rows already written)"
        f" -> {out_path}")
  print(sweep_report.table(summary))
  print(f"steering_sweep: wrote {paths['json']}, {paths['table']} and {paths['plot']}")
  return {**result, "summary": summary, **paths}
