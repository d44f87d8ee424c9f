"""A generative judge on the mesh: a causal LM (an HF directory or a training run, through
`load.model.load_model`) answering judge prompts greedily on the engine's batch API.

Every process runs the same engine over the same prompts (the engine is SPMD over the
mesh), so greedy answers, and the rewards read from them, are the same everywhere. A
prompt is rendered as the judge was trained on it: one user turn in the SteerLM chat
format with the model's own requested attributes (`steering.run_attributes` of its
export's `steerlm` section: what the server's chat route asks of the same model by
default, and, for an export trained without labels, an empty label, as its training
rendered its prompts).
"""

from __future__ import annotations

import ml_collections
from absl import logging

from helpsteer_jax import runtime, weights
from helpsteer_jax.config_sections import init_config, steer_config
from helpsteer_jax.data import template
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.generator import Generator, make_engine
from helpsteer_jax.judges import genrm
from helpsteer_jax.scoring.genrm import GenrmJudge
from helpsteer_jax.scoring.judge_budget import Budget
from helpsteer_jax.scoring.load import judge_model


def render(text: str, system: str, attributes: dict[str, int]) -> str:
  """A judge prompt as the judge's chat prompt: one user turn."""
  return template.generation_prompt(
      Conversation(system=system, turns=(Turn("User", text),)), attributes)


class EngineAnswers:
  """Judge prompts -> greedy answers of `generator`, in batches of the engine's rows."""

  def __init__(self, generator: Generator, max_new_tokens: int, system: str,
               attributes: dict[str, int]):
    self.generator, self.max_new_tokens = generator, int(max_new_tokens)
    self.system, self.attributes = system, attributes
    self.budget = Budget(generator.engine.max_length, self.max_new_tokens, 1)

  def render(self, text: str) -> str:
    return render(text, self.system, self.attributes)

  def tokens(self, text: str) -> int:
    """The judge prompt `text`'s tokens, rendered."""
    return len(self.generator.encode(self.render(text)))

  def __call__(self, prompts):
    """The answers; None (not asked: the pair is not judged) for a prompt that leaves no
    room for `max_new_tokens` in the engine's rows."""
    rendered = [self.render(p) for p in prompts]
    fits = [len(self.generator.encode(text)) <= self.budget.prompt for text in rendered]
    if not all(fits):
      logging.warning("GenRM judge: %d of %d prompts are longer than %d tokens"
                      " (scorer.max_len - scorer.judge_max_new_tokens) and are not judged",
                      fits.count(False), len(fits), self.budget.prompt)
    outputs = iter(self.generator.complete(
        [t for t, ok in zip(rendered, fits) if ok], self.max_new_tokens))
    answers = []
    for ok in fits:
      output = next(outputs) if ok else None
      answers.append(steering.response_text(output.text, output.finish_reason)
                     if output is not None else None)
    return answers


def load_genrm(section: ml_collections.ConfigDict, rt: runtime.Runtime | None,
               key: str = "scorer.source", unparsed: float | None = None) -> GenrmJudge:
  """The GenRM at `section.source` (an HF causal-LM directory or a run) as a scorer;
  `unparsed`: `GenrmJudge`'s."""
  config = ml_collections.ConfigDict(dict(
      model=section.model.copy_and_resolve_references(), init=init_config(source=section.source),
      seed=0, tokenizer=section.tokenizer, steer=steer_config(), steer_attributes=""))
  guidelines, add_bos = bool(section.judge_guidelines), bool(section.add_bos)

  def attributes() -> dict[str, int]:
    # The rule the server's chat route asks by (`serve.backend.default_attributes`), so
    # that the same model served answers a judge prompt as it does here.
    return steering.run_attributes(config, weights.steer_spec(config))

  def bare_tokens(tokenizer) -> int:
    bare = genrm.prompt(Conversation("", (Turn("User", ""),)), ("", ""), guidelines)
    return len(steering.encode_prompt(render(bare, template.DEFAULT_SYSTEM, attributes()),
                                      tokenizer, add_bos))

  model, tokenizer = judge_model(
      section, rt, str(section.source), key,
      Budget(int(section.max_len), int(section.judge_max_new_tokens), 1), bare_tokens,
      str(section.tokenizer), config)
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  engine = make_engine(model, rt.mesh, tokenizer, rules=rt.rules,
                       max_batch=int(section.batch_size), max_length=int(section.max_len),
                       pad_id=int(pad))
  answers = EngineAnswers(Generator(engine, add_bos=add_bos), section.judge_max_new_tokens,
                          template.DEFAULT_SYSTEM, attributes())
  return GenrmJudge(answers, section.aggregation, guidelines, answers.budget, unparsed)
