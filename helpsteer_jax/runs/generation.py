"""The generating tasks' shared pieces (generate, steering sweeps, MT-Bench answers):
the sampling settings, the input requests and the configured model behind a
`Generator`."""

from __future__ import annotations

import pathlib

import jax
import ml_collections

from helpsteer_jax import runtime
from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.generator import Generator, make_engine
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.load import model as loader


def sampling_config(config: ml_collections.ConfigDict) -> SamplingConfig:
  s = config.sampling
  return SamplingConfig(temperature=float(s.temperature), top_k=int(s.top_k),
                        top_p=float(s.top_p))


def read_input(config: ml_collections.ConfigDict, attributes: dict[str, int]) -> list:
  """Requests from `config.input`, or the 50 held-out demo prompts when it is empty."""
  if config.input == "-" and jax.process_count() > 1:
    raise ConfigError("--config.input=- (stdin): each process would read its own standard"
                      " input; with several processes give a file every process can read")
  if config.input:
    return steering.read_requests(config.input, attributes, config.system)
  return [steering.make_request(p, attributes, config.system) for p in demo_rows.heldout_prompts()]


def build_generator(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                    workdir: pathlib.Path, max_batch: int | None = None) -> Generator:
  """The configured model and tokenizer behind a `Generator`; the engine holds
  `max_batch` rows (default: `batch_size` for files, 1 for chat)."""
  model, tokenizer, pad = loader.load_with_tokenizer(config, rt, workdir)
  if max_batch is None:
    max_batch = config.batch_size if config.get("mode", "file") == "file" else 1
  engine = make_engine(model, rt.mesh, tokenizer, rules=rt.rules, max_batch=max_batch,
                       max_length=config.max_length or None, pad_id=pad,
                       stop_strings=tuple(config.stop_strings))
  return Generator(engine, add_bos=config.add_bos)
