"""SteerLM 2.0: iterated training of Q_θ(y|a,x) toward P(y|a,x) ∝ P(a|x,y) P(y|x).

Each round (`runs.rounds`) answers its prompts, each under a requested
attribute string a, with n sampled responses of the round's starting model
Q' (the AC-SFT model in round 1, the last round's result after), and writes
NeMo-Aligner's SteerLM 2.0 JSONL (`data.formats.steerlm2`) with, per response,
log P(a|x,y) (the attribute model's predictions, `losses.steerlm2.attribute_logprob`),
log P(y|x) (the unconditional model: `unconditional.*`, by default the starting
policy prompted without the label) and log Q'(y|a,x) (the round's model, on the
tokens training reads). Training then minimises `losses.steerlm2`'s loss with
the shared loop. Before round 1 and after every round the policy's attribute
adherence is measured by a steering sweep scored with the attribute model
(`eval.steering_sweep`); the report puts the models side by side.
"""

from __future__ import annotations

import functools
import json
import pathlib

import ml_collections
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import NamedSharding

from helpsteer_jax import frozen_pass, processes, runtime, sharding
from helpsteer_jax.data import template
from helpsteer_jax.data.batches import STEERLM2_BATCH, STEERLM2_INPUT
from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.data.features import steerlm2_rows
from helpsteer_jax.data.formats import steerlm2 as groups_lib
from helpsteer_jax.data.formats.helpsteer import helpsteer_fields
from helpsteer_jax.data.formats.rows import (
  BadRecordReport,
  iter_checked_rows,
  iter_rows,
  resolve_source,
)
from helpsteer_jax.data.records import ATTRIBUTES, HELPSTEER_ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.eval import adherence, sweep_report
from helpsteer_jax.eval import steering_sweep as sweep_lib
from helpsteer_jax.inference import best_of_n, steering
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.load import model as loader
from helpsteer_jax.losses import steerlm2 as loss_lib
from helpsteer_jax.models import builder
from helpsteer_jax.resume import append_batches
from helpsteer_jax.runs import policy, rounds
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.scoring import rewards as scoring_rewards
from helpsteer_jax.scoring.load import load_scorer, scorer_reads
from helpsteer_jax.train import abstract_step, export, loop

RESUMES = True  # a rerun resumes the workdir's run (main.py checks its fingerprint)


def config_reads() -> list:
  """The scorer kind's keys."""
  return scorer_reads()

SAMPLES, SWEEP_ROWS = "samples.jsonl", "sweep_generations.jsonl"
REQUEST_ROWS, ADHERENCE = "adherence_generations.jsonl", "adherence.json"
DEMO_ROWS_SEED = 30_000  # the demo rows whose prompts and labels SteerLM 2.0 samples for
DEMO_EVAL_SEED = 30_001  # held-out demo rows: the evaluation's attribute strings


def _names(config, spec) -> tuple[str, ...]:
  if config.steer_attributes:
    return steering.attribute_names(config.steer_attributes)
  return tuple(spec.attributes) or HELPSTEER_ATTRIBUTES


def _labelled_rows(config, held_out: bool = False, report: BadRecordReport | None = None
                   ) -> list[tuple[str, dict[str, int]]]:
  """(prompt, labels) of the training (or held-out) data: HelpSteer / HelpSteer2 rows, or
  the demo's; bad rows per `data.on_bad_record` (skipped ones counted in `report`)."""
  pc = config.prompts
  path = pc.eval_path if held_out else pc.train_path
  if not path:
    n, seed = ((config.eval.requests, DEMO_EVAL_SEED) if held_out
               else (pc.demo_rows, DEMO_ROWS_SEED))
    return [(r["prompt"], {n: r[n] for n in HELPSTEER_ATTRIBUTES})
            for r in demo_rows.demo_rows(n, seed)]
  kind, location = resolve_source(path)
  return [(p, s) for _, (p, _, s) in iter_checked_rows(
      iter_rows(kind, location), location, lambda r, w: helpsteer_fields(r),
      config.data.on_bad_record, report)]


def read_requests(config: ml_collections.ConfigDict, names: tuple[str, ...],
                  defaults: dict[str, int], held_out: bool = False,
                  report: BadRecordReport | None = None) -> list[steering.Request]:
  """The training (or held-out: `prompts.eval_path`, the first `eval.requests`) prompts
  with their requested attributes: each row's own labels (`prompts.attributes=labels`:
  the data's label distribution) or the run's (`run`: `steer`, and a JSONL row's own
  `attributes`). Bad rows per `data.on_bad_record` (skipped ones counted in `report`)."""
  pc = config.prompts
  path = pc.eval_path if held_out else pc.train_path
  if pc.attributes == "labels":
    out = [steering.make_request(p, {n: s[n] for n in names if n in s}, pc.system)
           for p, s in _labelled_rows(config, held_out, report)]
  elif path:
    out = steering.read_requests(path, defaults, pc.system,
                                 on_bad_record=config.data.on_bad_record, report=report)
  else:
    out = [steering.make_request(p, defaults, pc.system)
           for p, _ in _labelled_rows(config, held_out, report)]
  return out[:config.eval.requests] if held_out else out


def group_nll(model: nnx.Module, examples: list[dict], rt: runtime.Runtime, micro: int,
              chunk: int) -> np.ndarray:
  """NLL [G, n] of each example's responses under `model`, `micro` groups per batch."""
  graphdef, state = nnx.split(model)
  shards = sharding.spec_shard_count(sharding.batch_spec(rt.rules), rt.mesh, 0)
  layout = NamedSharding(rt.mesh, sharding.batch_spec(rt.rules))
  nll = frozen_pass.FrozenPass(lambda s, b: loss_lib.response_nll(nnx.merge(graphdef, s), b, chunk),
                   rt.mesh, layout, -(-micro // shards) * shards)
  return nll((state,), {k: np.stack([e[k] for e in examples]) for k in STEERLM2_INPUT.names})


def _requested(groups_requests: list[steering.Request], n: int, names) -> tuple[np.ndarray, ...]:
  req = np.zeros((len(groups_requests) * n, len(ATTRIBUTES)), np.int64)
  mask = np.zeros_like(req, dtype=np.float64)
  for i, r in enumerate(groups_requests):
    for name, value in r.attributes.items():
      if name in names:
        req[i * n:(i + 1) * n, ATTRIBUTES.index(name)] = value
        mask[i * n:(i + 1) * n, ATTRIBUTES.index(name)] = 1
  return req, mask


class Sampler:
  """One round's groups: n responses per request from the round's model, their attribute
  log-probability, and the round's and the unconditional model's log-probabilities."""

  def __init__(self, config, setup, model, unconditional, scorer, names, seed: int):
    self.config, self.setup, self.names, self.seed = config, setup, names, seed
    self.model, self.unconditional, self.scorer = model, unconditional, scorer
    sc = config.sampling
    self.gen = rounds.generator(model, setup.rt, setup.tokenizer, config,
                                sc.max_batch or sc.batch_prompts * sc.responses)
    self.sampling = SamplingConfig(temperature=sc.temperature, top_p=sc.top_p, top_k=sc.top_k)
    self.weights = scoring_rewards.weight_vector(config.scorer.weights.to_dict())

  def _examples(self, groups, labelled: bool) -> list[dict]:
    c, out = self.config, []
    for g in groups:
      example = steerlm2_rows.group_example(g, self.setup.tokenizer, c.train.seq_len,
                                            c.data.truncation, c.data.add_bos, labelled,
                                            ws=np.full(len(g.responses), 1 / len(g.responses)))
      if example is None:
        raise ConfigError(f"a response to {g.turns[-1].text[:60]!r} does not fit"
                          f" train.seq_len={c.train.seq_len}: raise it or lower"
                          " sampling.max_new_tokens")
      out.append(example)
    return out

  def answer(self, start: int, batch: list[steering.Request]) -> list[dict]:
    c, sc = self.config, self.config.sampling
    results = best_of_n.best_of_n(self.gen, batch, sc.responses, self.scorer, self.weights,
                                  sc.max_new_tokens, self.sampling, seed=self.seed + start)
    preds = np.asarray([[cand.scores[a] for a in ATTRIBUTES] for res in results
                        for cand in res.candidates], np.float64)
    requested, mask = _requested(batch, sc.responses, self.names)
    unscored = np.isnan(preds)
    if unscored.any():  # too long for the attribute model: the farthest label it could get
      logging.warning("steerlm2: %d responses could not be scored; they count as the worst"
                      " match of their request", int(unscored.any(-1).sum()))
      preds = np.where(unscored, np.where(requested <= 2, 4.0, 0.0), preds)
    log_pa = loss_lib.attribute_logprob(preds, requested, mask, c.loss.attribute_sigma)
    groups = [groups_lib.Group(r.conversation.system, r.conversation.turns,
                               template.label_string(r.attributes),
                               tuple(groups_lib.Response(cand.response, 0.0, 0.0, 0.0)
                                     for cand in res.candidates))
              for r, res in zip(batch, results)]
    micro = c.train.micro_batch
    chunk = c.train.loss_chunk_size
    log_q = -group_nll(self.model, self._examples(groups, True), self.setup.rt, micro, chunk)
    with_label = c.unconditional.with_label
    if with_label and self.unconditional is self.model:
      log_u = log_q  # the same model on the same tokens
    else:
      log_u = -group_nll(self.unconditional, self._examples(groups, with_label),
                         self.setup.rt, micro, chunk)
    n = sc.responses
    return [groups_lib.group_row(groups_lib.Group(g.system, g.turns, g.label, tuple(
        groups_lib.Response(resp.text, float(log_pa[i * n + j]), float(log_u[i, j]),
                            float(log_q[i, j])) for j, resp in enumerate(g.responses))))
            for i, g in enumerate(groups)]


def _matches(row: dict, request: steering.Request) -> bool:
  return (row.get("label") == template.label_string(request.attributes)
          and [t["value"] for t in row.get("prompt_turns", [])]
          == [t.text for t in request.conversation.turns])


def _unconditional(config, rt, start_model):
  u = config.unconditional
  if not u.source:
    return start_model
  cu = ml_collections.ConfigDict(config.to_dict())
  cu.init.source, cu.init.step = u.source, u.step
  return loader.load_model(cu, rt, loader.DECODE)


def sample_round(config, setup, r: int, requests, names, scorer) -> pathlib.Path:
  """Round r's groups file (appended batch by batch; resumed where a run stopped)."""
  workdir = setup.workdir
  path = rounds.round_dir(workdir, r) / SAMPLES
  path.parent.mkdir(parents=True, exist_ok=True)
  chosen = [requests[i] for i in rounds.prompt_indices(
      len(requests), config.prompts.per_iteration, config.seed, r)]
  cr = rounds.round_config(config, workdir, r)
  model = loader.load_model(cr, setup.rt, loader.DECODE)
  start = model if r == 1 else loader.load_model(config, setup.rt, loader.DECODE)
  sampler = Sampler(config, setup, model, _unconditional(config, setup.rt, start), scorer,
                    names, rounds.sampling_seed(config.seed, r))
  done = append_batches(path, chosen, _matches, "--workdir", config.sampling.batch_prompts,
                        sampler.answer)
  logging.info("steerlm2 round %d: %d groups (%d written before)", r, len(chosen), done)
  return path


def train_round(config, setup, r: int, spec) -> loop.RunResult:
  """Round r's training on its groups file, from round r-1's weights."""
  rdir = rounds.round_dir(setup.workdir, r)
  cr = rounds.round_config(config, setup.workdir, r)
  groups = groups_lib.read_groups(rdir / SAMPLES, config.data.on_bad_record)
  examples, _, report = steerlm2_rows.group_examples(
      groups, setup.tokenizer, config.train.seq_len, config.data.truncation,
      config.data.add_bos)
  logging.info("steerlm2 round %d: %s", r, report.summary())
  if not examples:
    raise ConfigError(f"{rdir / SAMPLES}: no group fits train.seq_len={config.train.seq_len}")
  parts, _ = policy.load_policy(cr, setup.rt)
  trainer = loop.Trainer(
      cr, rdir, setup.rt, parts,
      functools.partial(loss_lib.steerlm2_loss, chunk_size=config.train.loss_chunk_size),
      examples, flops_per_token=setup.model_cfg.flops_per_token(config.train.seq_len),
      export_fn=export.hf_exporter(rdir, setup.tokenizer_dir, setup.tokenizer, parts, cr, spec,
                                   f"SteerLM 2.0 policy (iteration {r})"))
  result = trainer.run()
  trainer.close()
  return result


def _label(r: int) -> str:
  return "AC-SFT" if r == 0 else f"iteration {r}"


def evaluate(config, setup, r: int, names, defaults, scorer) -> None:
  """Round r's result (0: the starting policy): greedy answers to held-out requests for
  the data's attribute strings, and a steering sweep, scored; `adherence.json` then
  marks the evaluation done."""
  ec = config.eval
  rdir = rounds.round_dir(setup.workdir, r)
  rdir.mkdir(parents=True, exist_ok=True)
  values = sweep_lib.parse_values(ec.scores, "eval.scores")
  swept = sweep_lib.parse_attributes(ec.attributes, tuple(defaults), "eval.attributes")
  grid = sweep_lib.settings(defaults, swept, values)
  texts = demo_rows.heldout_prompts(ec.prompts)
  prompts = rounds.fitting([steering.make_request(t, defaults, config.prompts.system)
                            for t in texts], setup.tokenizer, config, ec.max_new_tokens,
                           "steering sweep prompts")
  held_out = rounds.fitting(read_requests(config, names, defaults, held_out=True),
                            setup.tokenizer, config, ec.max_new_tokens, "held-out requests")
  model = loader.load_model(rounds.round_config(config, setup.workdir, r + 1), setup.rt,
                             loader.DECODE)
  gen = rounds.generator(model, setup.rt, setup.tokenizer, config, ec.batch_size)
  adherence.answer(gen, held_out, rdir / REQUEST_ROWS, batch_size=ec.batch_size,
                   max_new_tokens=ec.max_new_tokens, scorer=scorer, seed=config.seed)
  sweep_lib.generate_rows(gen, sweep_lib.sweep_requests(prompts, grid), rdir / SWEEP_ROWS,
                          batch_size=ec.batch_size, max_new_tokens=ec.max_new_tokens,
                          sampling=SamplingConfig(), seed=config.seed, scorer=scorer)
  if processes.is_primary():
    summary = sweep_lib.summarize(sweep_lib.read_rows(rdir / SWEEP_ROWS), grid)
    sweep_report.write(summary, rdir, _label(r) if r == 0 else f"SteerLM 2.0 {_label(r)}")
    result = adherence.errors(sweep_lib.read_rows(rdir / REQUEST_ROWS))
    (rdir / ADHERENCE).write_text(json.dumps(result, indent=2) + "\n")


def _report(config, workdir: pathlib.Path) -> dict:
  """Process 0: the held-out requests' table and the sweeps' comparison of every model
  evaluated so far."""
  requests, sweeps = {}, {}
  for r in range(config.iterations + 1):
    rdir = rounds.round_dir(workdir, r)
    if (rdir / ADHERENCE).exists():
      requests[_label(r)] = json.loads((rdir / ADHERENCE).read_text())
      sweeps[_label(r)] = sweep_report.read(rdir / sweep_report.JSON_FILE)
  out = sweep_report.write_comparison(sweeps, workdir, "SteerLM 2.0: steering sweeps")
  out["sweep_table"], out["sweep_adherence"] = out.pop("table"), out.pop("adherence")
  out["table"], out["adherence"] = adherence.table(requests), requests
  (workdir / "adherence_requests.md").write_text(
      "# SteerLM 2.0: held-out attribute strings\n\n" + out["table"] + "\n")
  return out


def batch_schema(config):
  return STEERLM2_BATCH, {"length": config.train.seq_len,
                          "responses": config.sampling.responses}


def abstract_train_step(config: ml_collections.ConfigDict,
                        rt: runtime.Runtime) -> abstract_step.StepSpec:
  """The SteerLM 2.0 step on abstract weights and groups (compile-only runs)."""
  model_cfg = runtime.model_config(config, weights=False)
  schema, dims = batch_schema(config)
  return abstract_step.trainer_step_spec(
      config, rt, lambda: builder.new_model(model_cfg),
      functools.partial(loss_lib.steerlm2_loss, chunk_size=config.train.loss_chunk_size),
      schema.row_fields(**dims), model_cfg.flops_per_token(config.train.seq_len),
      tokens_per_row=config.sampling.responses * config.train.seq_len)


def check(config: ml_collections.ConfigDict) -> None:
  """Every setting problem, before anything loads."""
  rounds.check(config)
  problems = []
  if config.loss.attribute_sigma <= 0:
    problems.append(f"loss.attribute_sigma={config.loss.attribute_sigma} must be > 0")
  if config.sampling.responses < 2:
    problems.append("sampling.responses must be at least 2 (a group's weights compare them)")
  if config.prompts.attributes not in ("labels", "run"):
    problems.append(f"prompts.attributes={config.prompts.attributes!r}: choose labels or run")
  if config.sampling.batch_prompts < 1:
    problems.append("sampling.batch_prompts must be at least 1")
  if problems:
    raise ConfigError("; ".join(problems))


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  check(config)
  setup = setup_lib.prepare(config, workdir)
  loop.check_batch_config(config.train, setup.rt)  # before an iteration's sampling
  spec = policy.source_spec(config)
  names = _names(config, spec)
  # A source without labels steers NeMo's nine here: SteerLM 2.0 trains it to.
  defaults = steering.run_attributes(config, spec if spec.attributes else None)
  bad = BadRecordReport()
  requests = rounds.fitting(read_requests(config, names, defaults, report=bad),
                            setup.tokenizer, config, config.sampling.max_new_tokens,
                            "steerlm2 training prompts")
  scorer = load_scorer(config.scorer, setup.rt)
  status = "finished"
  if not rounds.exists(rounds.round_dir(setup.workdir, 0) / ADHERENCE):
    evaluate(config, setup, 0, names, defaults, scorer)
  for r in range(1, config.iterations + 1):
    rdir = rounds.round_dir(setup.workdir, r)
    if not rounds.finished(rdir):
      sample_round(config, setup, r, requests, names, scorer)
      result = train_round(config, setup, r, spec)
      if result.status != "finished":
        status = result.status
        break
      summary_lib.write_summary(rdir / rounds.SUMMARY, summary_lib.training_summary(result))
    if not rounds.exists(rdir / ADHERENCE):
      evaluate(config, setup, r, names, defaults, scorer)
  summary = {"status": status, "iterations": config.iterations, "bad_records": bad.total}
  if processes.is_primary():
    summary.update(_report(config, setup.workdir))
  last = rounds.round_dir(setup.workdir, config.iterations)
  summary_lib.write_summary(
      setup.workdir / "summary.json", summary,
      f"steerlm2: {status}; attribute adherence on held-out requests (mean absolute error of"
      f" the attribute model's predictions to the requested values):\n"
      f"{summary.get('table', '')}\nsteering sweeps:\n{summary.get('sweep_table', '')}",
      *summary_lib.skipped_lines(bad),
      outputs={"adherence (held-out requests)": setup.workdir / "adherence_requests.md",
               "adherence (sweeps)": setup.workdir / sweep_report.COMPARE_TABLE,
               "adherence plot": setup.workdir / sweep_report.COMPARE_PLOT,
               "last round": last, "last round's HF model": last / "hf"})
  return summary
