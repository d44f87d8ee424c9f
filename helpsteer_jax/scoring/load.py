"""`load_scorer`: the one way a task gets an attribute scorer, from `config.scorer`.

`scorer.source` names where the attribute model is:

- an attribute_model workdir or its `checkpoints/` (Orbax; shapes read from
  it, family and numerics from `scorer.model`), an HF *ForSequenceClassification
  directory (its HF export), or an HF causal-LM directory with `scorer.head`
  (a head.npz): loaded here and sharded over the mesh (`model.ModelScorer`);
- `http://host:port/v1`: a configs/serve.py server's attribute model, asked by
  process 0 (`remote.HttpScorer`);
- `demo_rules`: the demo data's own rules;
- `genrm_verifier`: NeMo-Aligner's GenRM verifier, each answer checked against its
  prompt's reference (`genrm.verifier_rows`), the reward that trains a GenRM;
- `principle_verifier`: the reward that trains a principle judge (RLBFF), read from the
  policy's own log-probabilities of its verdict (`principle_verifier`, given the
  policy's tokenizer: the rl task alone);
- `package.module:function`: a user's factory, called with `config.scorer`,
  returning a function conversations -> [n, 9] (host-side: each process
  scores its share).

With `scorer.judge` set the source is a generative judge instead, a server's base URL
(asked by process 0) or a causal LM on the mesh:

- `genrm` (`genrm.GenrmJudge`): pairwise judgements within each context group, served
  through /v1/chat/completions or decoded on the engine (`inference.judge`);
- `principle` (`principle_judge`): log p(" Yes") - log p(" No") at the verdict, served
  through /v1/completions or one forward pass on the mesh, after the judge's reasoning
  when `judge_max_new_tokens` > 0 (`inference.principle_reasoning` decodes it).

What decodes on the engine is a layer above this one, so `JUDGES` imports it by name
when a run asks for it, as the model families are. With `scorer.principle_source` set,
the scorer is the attribute model plus that principle judge (`combine`).

Every one is a `scorer.Scorer`: called on every process with the same
conversations, it returns the same [n, 9] predictions everywhere.
`load_reward_model` is the attribute model itself from such a path.
"""

from __future__ import annotations

import importlib
import pathlib
from typing import Any, Callable

import ml_collections

from helpsteer_jax import choices, config_base, runtime, saved_params, weights
from helpsteer_jax.config_reads import Reads
from helpsteer_jax.config_sections import init_config
from helpsteer_jax.data.features.regression_ids import RegressionTokenizer
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.judges import genrm as genrm_judges
from helpsteer_jax.load import model as loader
from helpsteer_jax.models import hf, reward_hf
from helpsteer_jax.models.reward import RewardModel
from helpsteer_jax.registry import LazyRegistry
from helpsteer_jax.scoring import genrm, principle_judge, remote, rules
from helpsteer_jax.scoring.combine import CombinedScorer
from helpsteer_jax.scoring.judge_budget import Budget
from helpsteer_jax.scoring.model import ModelScorer
from helpsteer_jax.scoring.principle_verifier import VERIFIER, PrincipleVerifier
from helpsteer_jax.scoring.scorer import HostScorer, PrimaryScorer, Scorer

JUDGE_KINDS = tuple(choices.JUDGES)
# What decodes a judge's answers on the mesh (the engine, a layer above this one: imported
# by name when a run asks for it, as the model families are). genrm: (section, rt, key,
# unparsed) -> Scorer; principle's reasoning: (LocalJudge, model, rt, max_new_tokens) ->
# Scorer.
JUDGES = LazyRegistry(choices.JUDGES)


def is_factory(source: str) -> bool:
  """`package.module:function` (and no such path)."""
  module_name, sep, name = source.partition(":")
  return bool(sep and name.isidentifier()
              and all(part.isidentifier() for part in module_name.split("."))
              and not pathlib.Path(source).exists())


def _factory(section: ml_collections.ConfigDict, key: str):
  module_name, _, name = section.source.partition(":")
  try:
    factory = getattr(importlib.import_module(module_name), name)
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"{key}={section.source!r} cannot be loaded: {e}") from None
  return factory(section)


def tokenizer_dir(section: ml_collections.ConfigDict, key: str) -> str:
  """`runtime.find_tokenizer` for the attribute model of a scorer section."""
  source = pathlib.Path(section.source).expanduser()
  hf_dir = str(source) if section.head or reward_hf.is_reward_dir(source) else ""
  return runtime.find_tokenizer(section.tokenizer, hf_dir, "" if hf_dir else str(source),
                                key=key.rsplit(".", 1)[0] + ".tokenizer")


def load_reward_model(source: str, rt: runtime.Runtime,
                      model: ml_collections.ConfigDict | None = None,
                      head: str = "") -> RewardModel:
  """The trained attribute model from `source` on `rt`'s mesh: an HF
  *ForSequenceClassification directory, an attribute-model workdir / Orbax checkpoint,
  or (with `head`, a head file) an HF causal-LM directory as the backbone; built by
  `load.model.load_model` (REWARD).

  An Orbax checkpoint's shapes are read from it; `model` (a
  `config_base.model_section`, default the tiny model) gives the family,
  the rest of the config and the numerics.
  """
  config = ml_collections.ConfigDict(dict(
      model=model.copy_and_resolve_references() if model is not None
      else config_base.model_section("tiny"), init=init_config(source=source), seed=0))
  if head:
    if reward_hf.is_reward_dir(source):
      raise ConfigError(f"{source} holds a trained head (HF sequence classification): leave"
                        f" the head file {head} out")
    config.init.head = head
  elif not reward_hf.is_reward_dir(source):
    shapes, step = saved_params.param_shapes(source)
    if not any(path[0] == "head" for path in shapes):
      raise ConfigError(f"{saved_params.checkpoint_dir(source)} step {step} is not an"
                        " attribute-model checkpoint (no reward head); give an"
                        " attribute_model workdir or its HF export")
  return loader.load_model(config, rt, loader.REWARD)


def model_scorer(section: ml_collections.ConfigDict, rt: runtime.Runtime,
                 key: str = "scorer.source") -> ModelScorer:
  """The attribute model at `section.source` (a path) on `rt`'s mesh."""
  tokenizer = hf.load_tokenizer(tokenizer_dir(section, key))
  model = load_reward_model(section.source, rt, section.model, section.head)
  runtime.check_tokenizer_fits(tokenizer, model.cfg.vocab_size,
                               "set --config.scorer.tokenizer to the attribute model's")
  tok = RegressionTokenizer(tokenizer, int(section.max_len), section.truncation,
                            bool(section.add_bos))
  return ModelScorer(model, rt, tok, int(section.batch_size))


def check_source(source: str, key: str = "scorer.source") -> str:
  """`source` if it names a scorer (a path that exists, a URL, demo_rules, a factory);
  ConfigError naming `key` otherwise."""
  if not source:
    raise ConfigError(f"{key} is empty: give an attribute_model workdir or its HF export"
                      " (<workdir>/hf), a configs/serve.py server's base URL"
                      f" (http://127.0.0.1:8000/v1), {rules.DEMO_RULES}, or"
                      " package.module:function (a factory taking config.scorer and"
                      " returning a function conversations -> [n, 9] predictions)")
  if (source not in (rules.DEMO_RULES, genrm.VERIFIER, VERIFIER) and not remote.is_url(source)
      and not is_factory(source) and not pathlib.Path(source).expanduser().exists()):
    raise ConfigError(f"{key}={source!r}: no such file or directory, URL or"
                      " package.module:function; give an attribute_model workdir or its HF"
                      " export, a server's base URL (http://host:port/v1), a factory, or"
                      f" {rules.DEMO_RULES} ({genrm.VERIFIER}: a GenRM's training reward)")
  return source


def judge_model(section: ml_collections.ConfigDict, rt: runtime.Runtime | None, source: str,
                key: str, budget: Budget, bare_tokens: Callable[[Any], int],
                tokenizer_dir: str = "",
                config: ml_collections.ConfigDict | None = None) -> tuple[Any, Any]:
  """A generative judge's causal LM at `source` (an HF directory or a run) on `rt`'s mesh,
  loaded DECODE with `section.model`'s family and numerics (or `config`'s, which names
  the source), and its tokenizer (`tokenizer_dir`, else its source's). Before the weights
  load, the judge's prompt with no conversation in it (`bare_tokens(tokenizer)` tokens)
  has to fit its `budget` (`judge_budget`): one that cannot judge anything is refused."""
  if rt is None:
    raise ValueError("a local judge needs the runtime's mesh")
  if config is None:
    config = ml_collections.ConfigDict(dict(
        model=section.model.copy_and_resolve_references(), init=init_config(source=source),
        seed=0))
  init = config.init
  if not (weights.hf_dir(init) or weights.orbax_run(init)):
    raise ConfigError(f"{key}={source!r} is neither an HF causal-LM directory nor a"
                      " training run: a generative judge is a language model")
  tokenizer = hf.load_tokenizer(runtime.find_tokenizer(
      tokenizer_dir, weights.hf_dir(init), weights.orbax_run(init),
      key=key.rsplit(".", 1)[0] + ".tokenizer"))
  budget.check(bare_tokens(tokenizer),
               "judge prompt, not even its own text with no conversation in it")
  model = loader.load_model(config, rt, loader.DECODE)
  runtime.check_tokenizer_fits(tokenizer, model.cfg.vocab_size,
                               "set --config.scorer.tokenizer to the judge's")
  return model, tokenizer


def principle_scorer(section: ml_collections.ConfigDict, rt: runtime.Runtime | None,
                     source: str, key: str, tokenizer_dir: str = "") -> Scorer:
  """A principle judge at `source`: a server's URL, else a causal LM on `rt`'s mesh (its
  tokenizer `tokenizer_dir`, else its source's)."""
  steps = int(section.judge_max_new_tokens)
  if steps < 0:
    raise ConfigError(f"{key.rsplit('.', 1)[0]}.judge_max_new_tokens={steps}: give the"
                      " judge's reasoning budget in tokens (0: no reasoning)")
  if remote.is_url(source):
    return PrimaryScorer(principle_judge.HttpJudge(source, str(section.principle),
                                                   int(section.batch_size),
                                                   max_new_tokens=steps))
  budget = Budget(int(section.max_len), steps)
  model, tokenizer = judge_model(
      section, rt, source, key, budget,
      lambda tok: principle_judge.bare_tokens(tok, bool(section.add_bos), steps > 0),
      tokenizer_dir)
  judge = principle_judge.LocalJudge(model, rt, tokenizer, batch_size=int(section.batch_size),
                                     max_len=int(section.max_len),
                                     add_bos=bool(section.add_bos),
                                     principle_text=str(section.principle))
  return JUDGES[principle_judge.JUDGE](judge, model, rt, steps) if steps else judge


def load_scorer(section: ml_collections.ConfigDict, rt: runtime.Runtime | None,
                key: str = "scorer.source", tokenizer=None,
                neutral_unparsed: bool = False) -> Scorer:
  """The scorer `section.source` names; `rt` (the mesh) is needed for a local model,
  `tokenizer` (the policy's) for `principle_verifier`. `neutral_unparsed`: a GenRM judge
  gives a completion whose judgements were answered and none parsed the scale's neutral
  reward (`judges.genrm.NEUTRAL`, RL's) instead of NaN (not scored)."""
  if section.get("principle_source"):
    judge_key = key.rsplit(".", 1)[0] + ".principle_source"
    judge = principle_scorer(section, rt, check_source(str(section.principle_source),
                                                       judge_key), judge_key)
    attribute = section.copy_and_resolve_references()
    attribute.principle_source = ""
    return CombinedScorer(load_scorer(attribute, rt, key, tokenizer), judge,
                          float(section.principle_coef))
  source = check_source(str(section.source or ""), key)
  judge = str(section.get("judge") or "")
  if judge:
    return _judge(section, rt, key, judge, source, neutral_unparsed)
  if source == genrm.VERIFIER:
    return HostScorer(genrm.verifier_rows)
  if source == VERIFIER:
    if tokenizer is None:
      raise ConfigError(f"{key}={VERIFIER} reads the policy's own log-probabilities of its"
                        " verdicts: only the rl task (rl:principle) can use it")
    return HostScorer(PrincipleVerifier(tokenizer, float(section.penalty)))
  if source == rules.DEMO_RULES:
    return HostScorer(rules.demo_rule_scores)
  if remote.is_url(source):
    return PrimaryScorer(remote.HttpScorer(source, int(section.batch_size)))
  if is_factory(source):
    return HostScorer(_factory(section, key))
  if rt is None:
    raise ValueError("a local attribute model needs the runtime's mesh")
  return model_scorer(section, rt, key)


def _judge(section: ml_collections.ConfigDict, rt: runtime.Runtime | None, key: str,
           judge: str, source: str, neutral_unparsed: bool = False) -> Scorer:
  """A generative judge `judge` at `source`: served (a URL) or on the mesh."""
  if judge not in JUDGE_KINDS:
    raise ConfigError(f"{key.rsplit('.', 1)[0]}.judge={judge!r}: expected one of"
                      f" {', '.join(JUDGE_KINDS)} (or empty: an attribute model)")
  if source in (rules.DEMO_RULES, genrm.VERIFIER, VERIFIER) or is_factory(source):
    raise ConfigError(f"{key}={source!r} with judge={judge}: the judge is a causal LM (an"
                      " HF directory or a training run) or a server's base URL")
  if judge == principle_judge.JUDGE:
    return principle_scorer(section, rt, source, key, str(section.tokenizer))
  if int(section.judge_max_new_tokens) < 1:
    raise ConfigError(f"{key.rsplit('.', 1)[0]}.judge_max_new_tokens="
                      f"{section.judge_max_new_tokens}: a GenRM writes its answer (its"
                      " analysis and \\boxed{} scores); give its budget in tokens")
  unparsed = genrm_judges.NEUTRAL.get(section.aggregation) if neutral_unparsed else None
  if remote.is_url(source):
    return PrimaryScorer(genrm.GenrmJudge(
        genrm.ServedAnswers(source, section.judge_max_new_tokens, section.judge_model),
        section.aggregation, bool(section.judge_guidelines), unparsed=unparsed))
  return JUDGES[judge](section, rt, key, unparsed)


def unscored_cause(section: ml_collections.ConfigDict, scorer: Scorer | None = None) -> str:
  """Why `section`'s scorer leaves a conversation unscored (NaN), and what to change: by
  its kind, with a GenRM judge's counts of how its judgements went when `scorer` is one
  (a served one's are process 0's)."""
  judge = str(section.get("judge") or "")
  source = str(section.source or "")
  if judge == "genrm":
    return _genrm_cause(section, getattr(scorer, "fn", scorer), remote.is_url(source))
  too_long = f"longer than scorer.max_len={int(section.max_len)}"
  if judge == principle_judge.JUDGE:
    return f"the principle judge's inputs are {too_long}: raise scorer.max_len"
  if section.get("principle_source"):
    return (f"the attribute model's input or the principle judge's ({section.principle_source})"
            f" is {too_long}: raise scorer.max_len")
  if source in (rules.DEMO_RULES, genrm.VERIFIER, VERIFIER) or is_factory(source):
    return f"the scorer function {source} returned NaN for them"
  drop = section.get("truncation") == "drop"
  return (f"the attribute model's input is {too_long}"
          f"{' (scorer.truncation=drop)' if drop else ''}: raise scorer.max_len"
          f"{' or set scorer.truncation=truncate_left' if drop else ''}")


def _genrm_cause(section: ml_collections.ConfigDict, judge: Any, served: bool) -> str:
  counts = getattr(judge, "counts", None) or {}
  known = bool(counts.get("answered") or counts.get("not_asked"))
  neutral = getattr(judge, "unparsed", None) is not None  # a parse failure gets a reward
  parse = not neutral and (bool(counts.get("not_parsed")) if known else True)
  budget = bool(counts.get("not_asked")) if known else not served
  causes = []
  if parse or not budget:
    causes.append("the GenRM judge's answers about them do not parse (no \\boxed{} scores"
                  " and ranking in its format): judge with a model trained to answer in it,"
                  " with scorer.judge_guidelines as it was trained")
  if budget:
    causes.append(f"their pairs' judge prompts are longer than scorer.max_len="
                  f"{int(section.max_len)} - scorer.judge_max_new_tokens="
                  f"{int(section.judge_max_new_tokens)} tokens: raise scorer.max_len or lower"
                  " scorer.judge_max_new_tokens")
  told = (f" (of {counts['answered'] + counts['not_asked']} pair judgements,"
          f" {counts['not_parsed']} answers did not parse and {counts['not_asked']} prompts"
          " were over that budget)" if known else "")
  return "; or ".join(causes) + told


def _local(source: str) -> bool:
  """Whether `source` names a model loaded on the mesh (a path; "" is a missing one)."""
  return not (source in (rules.DEMO_RULES, genrm.VERIFIER, VERIFIER) or remote.is_url(source))


def _runs_locally(section: ml_collections.ConfigDict) -> bool:
  """Whether a model of `section` (the attribute model, or a judge) is loaded on the mesh."""
  return _local(str(section.source or "")) or (
      bool(section.principle_source) and _local(str(section.principle_source)))


def scorer_reads(prefix: str = "scorer", reads_all=None) -> list[Reads]:
  """The keys of a scorer section (`config_reads`) only some kinds read: a factory is
  given the whole section, so it reads every key, as does a run where
  `reads_all(config)` (a task whose other settings load more scorers from it)."""
  def on(test):
    def when(config) -> bool:
      section = config[prefix]
      return (is_factory(str(section.source or "")) or test(section)
              or bool(reads_all and reads_all(config)))
    return when

  def key(*names: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{n}" for n in names)

  source, judge = f"{prefix}.source", f"{prefix}.judge"
  return [
      Reads(key("model", "tokenizer", "max_len", "add_bos"), source,
            "a path (a model on the mesh: an attribute model or a judge)", on(_runs_locally),
            harmless=True),
      Reads(key("head", "truncation"), source, "an attribute model's path (no judge)",
            on(lambda s: not s.judge and _local(str(s.source or ""))), harmless=True),
      Reads(key("batch_size"), source, "a model (a path or a server's URL)",
            on(lambda s: bool(s.judge) or bool(s.principle_source)
               or str(s.source or "") not in (rules.DEMO_RULES, genrm.VERIFIER, VERIFIER)),
            harmless=True),
      Reads(key("judge_max_new_tokens"), judge, "genrm or principle (or a principle_source)",
            on(lambda s: bool(s.judge) or bool(s.principle_source))),
      Reads(key("aggregation", "judge_guidelines", "judge_model"), judge, "genrm",
            on(lambda s: s.judge == "genrm")),
      Reads(key("principle"), judge, "principle (or a principle_source)",
            on(lambda s: s.judge == principle_judge.JUDGE or bool(s.principle_source))),
      Reads(key("principle_coef"), f"{prefix}.principle_source", "set",
            on(lambda s: bool(s.principle_source))),
      Reads(key("penalty"), source, VERIFIER, on(lambda s: s.source == VERIFIER)),
  ]
