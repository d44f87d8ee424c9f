"""The rounds of the iterated tasks (SteerLM 2.0, iterative DPO).

A round samples with the current policy, writes what it sampled (and scored)
to a file, and trains the next policy on that file. Round r (1..N) lives in
`<workdir>/iteration_<r>/`: its data file (process 0 appends it batch by batch;
a rerun resumes it where it stopped, `resume.append_batches`), then a training
run in the same directory that starts from round r-1's final checkpoint
(round 1: the configured policy, `init`), with its own checkpoints (a rerun
resumes it), and `summary.json` when it is done (a rerun skips the round).
`<workdir>/iteration_0/` holds the starting policy's evaluation. Every
decision to skip is made on process 0 and shared (`multihost.on_primary`).
"""

from __future__ import annotations

import json
import pathlib

import ml_collections
from absl import logging
from flax import nnx

from helpsteer_jax import multihost, runtime
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.generator import Generator, make_engine
from helpsteer_jax.inference.sampling import sample_seed
from helpsteer_jax.rl.rollout import prompt_schedule

SUMMARY = "summary.json"


def round_dir(workdir: pathlib.Path, r: int) -> pathlib.Path:
  return pathlib.Path(workdir) / f"iteration_{r}"


def round_config(config: ml_collections.ConfigDict, workdir: pathlib.Path,
                 r: int) -> ml_collections.ConfigDict:
  """The config of round r's policy: round 1 starts from `init`, round r > 1 from round
  r-1's final checkpoint (0: the starting policy itself)."""
  out = ml_collections.ConfigDict(config.to_dict())
  if r > 1:
    out.init.source, out.init.step = str(round_dir(workdir, r - 1)), -1
  return out


def finished(rdir: pathlib.Path) -> bool:
  """Whether round `rdir` trained to the end (its summary says so), as process 0 sees it."""
  def read() -> bool:
    path = pathlib.Path(rdir) / SUMMARY
    return path.exists() and json.loads(path.read_text()).get("status") == "finished"
  return bool(multihost.on_primary(read))


def line_count(path: pathlib.Path) -> int:
  """The lines of `path` as process 0 reads them (0 when it does not exist)."""
  path = pathlib.Path(path)
  return int(multihost.on_primary(
      lambda: len(path.read_text().splitlines()) if path.exists() else 0))


def exists(path: pathlib.Path) -> bool:
  """Whether `path` exists, as process 0 sees it (the same answer on every process)."""
  return bool(multihost.on_primary(lambda: pathlib.Path(path).exists()))


def check(config: ml_collections.ConfigDict) -> None:
  """What the rounds cannot do, said before anything loads."""
  if config.model.lora.rank:
    raise ConfigError("iterated training trains the whole model (each round starts from the"
                      " last round's weights): set model.lora.rank=0")
  if config.iterations < 1:
    raise ConfigError(f"iterations={config.iterations}: give at least 1")
  if config.train.export_best:
    raise ConfigError(f"train.export_best={config.train.export_best!r}: a round trains"
                      " without evaluation data and the next round starts from its last"
                      " step; set train.export_best=\"\" (the rounds' own evaluations"
                      " compare them)")


def generator(model: nnx.Module, rt: runtime.Runtime, tokenizer, config: ml_collections.ConfigDict,
              max_batch: int) -> Generator:
  """A `Generator` on `model`'s engine (rows of `train.seq_len` tokens)."""
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  engine = make_engine(model, rt.mesh, tokenizer, rules=rt.rules, max_batch=max_batch,
                       max_length=config.train.seq_len, pad_id=int(pad),
                       stop_strings=tuple(config.sampling.stop_strings))
  return Generator(engine, add_bos=config.data.add_bos)


def fitting(requests: list[steering.Request], tokenizer, config: ml_collections.ConfigDict,
            max_new_tokens: int, what: str) -> list[steering.Request]:
  """The requests whose prompt leaves `max_new_tokens` in rows of `train.seq_len`; the
  others are left out with a warning (the same on every process)."""
  limit = config.train.seq_len - max_new_tokens
  kept = [r for r in requests if len(r.prompt_ids(tokenizer, config.data.add_bos)) <= limit]
  if len(kept) < len(requests):
    logging.warning("%s: %d of %d prompts are longer than %d tokens (train.seq_len -"
                    " max_new_tokens) and are left out", what, len(requests) - len(kept),
                    len(requests), limit)
  if not kept:
    raise ConfigError(f"{what}: no prompt fits in {limit} tokens: raise train.seq_len or"
                      " lower max_new_tokens")
  return kept


def sampling_seed(seed: int, r: int) -> int:
  """Round r's base sampling seed (`sample_seed(seed, r)`), the same on every process; a
  batch adds its first row to it (`best_of_n`)."""
  return sample_seed(seed, r)


def prompt_indices(n: int, per_round: int, seed: int, r: int) -> list[int]:
  """The prompts round r answers: all of them in order, or `per_round` drawn without
  repeats from epochs over them (`rl.rollout.prompt_schedule`)."""
  if not per_round or per_round >= n:
    return list(range(n))
  return sorted(prompt_schedule(n, per_round, seed, r - 1))

