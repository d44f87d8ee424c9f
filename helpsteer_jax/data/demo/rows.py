"""A small HelpSteer-format dataset whose attributes follow from the text.

The rows are generated deterministically from a seed (no downloads, no
external text) so that the default runs can demonstrate the method:
- verbosity is the response length (1, 2, 3, 5 or 7 sentences);
- correctness is whether the answer (one-digit arithmetic, a capital city, a
  count of listed items) is right;
- coherence drops when a sentence is garbled (words shuffled / repeated);
- complexity is the register: plain words (1) or technical phrasing (3);
- helpfulness combines correctness and coherence.
Each attribute can therefore be learned from the text by a small model, and
an AC-SFT model trained on it can be steered (e.g. verbosity -> length).
"""

from __future__ import annotations

import gzip
import json
import pathlib
import re
from typing import Iterator

import numpy as np

from helpsteer_jax.data.records import HELPSTEER_ATTRIBUTES

SENTENCES_PER_VERBOSITY = (1, 2, 3, 5, 7)
TURN_USER = "\n<extra_id_1>User\n"
TURN_ASSISTANT = "\n<extra_id_1>Assistant\n"

CAPITALS = (
    ("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Germany", "Berlin"), ("Japan", "Tokyo"), ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Canada", "Ottawa"),
    ("Norway", "Oslo"), ("Greece", "Athens"), ("Chile", "Santiago"),
    ("Poland", "Warsaw"), ("Cuba", "Havana"), ("Ireland", "Dublin"),
    ("Austria", "Vienna"),
)
CATEGORIES = {
    "fruits": ("apple", "banana", "cherry", "grape", "lemon", "mango", "pear", "plum"),
    "colors": ("red", "blue", "green", "yellow", "purple", "orange", "white", "black"),
    "animals": ("cat", "dog", "horse", "rabbit", "tiger", "whale", "eagle", "frog"),
    "tools": ("hammer", "saw", "drill", "wrench", "ladder", "shovel", "brush", "rake"),
}
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

# Filler sentences by topic and register (plain, technical). Placeholders are
# filled from the example; each list is long enough for verbosity 4.
FILLERS = {
    "math": (
        ("Start with {a}.", "Begin with the first operand, {a}."),
        ("Then count on by {b}.", "Apply the operation with the second operand, {b}."),
        ("You can check it on your fingers.",
         "The result can be verified by the inverse operation."),
        ("Small sums like this come up every day.",
         "Such elementary operations underpin all of arithmetic."),
        ("It is a quick thing to work out.",
         "The computation requires a single step of evaluation."),
        ("Writing it down can help.", "Expressing it symbolically clarifies the structure."),
        ("So that is the result.", "Hence the evaluation is complete."),
    ),
    "capital": (
        ("{country} is a country with a long history.",
         "{country} is a sovereign state with an extensive historical record."),
        ("Its capital is its largest center of government.",
         "The capital hosts the principal institutions of the national government."),
        ("Many people visit it every year.",
         "It attracts a substantial volume of international tourism."),
        ("The city has famous old buildings.", "The city exhibits notable architectural heritage."),
        ("It is a busy and lively place.", "It functions as a dense economic and cultural hub."),
        ("You can find it on any map.",
         "Its location is documented in standard cartographic references."),
        ("That is the capital you asked about.",
         "This constitutes the answer to the geographical query."),
    ),
    "list": (
        ("These are all common {category}.", "Each item belongs to the category of {category}."),
        ("You can see them in many places.",
         "They are observed across a wide range of environments."),
        ("People know them well.", "They are widely recognized in general knowledge."),
        ("Each one is a little different.",
         "The members of the set differ in their characteristics."),
        ("There are many more to choose from.", "The category admits numerous additional members."),
        ("I hope this list is useful.", "This enumeration should satisfy the request."),
        ("That makes the list complete.", "The enumeration is therefore complete."),
    ),
}


def _sentences_for(topic: str, answer: str, fmt: dict, verbosity: int,
                   technical: bool, rng: np.random.RandomState) -> list[str]:
  n = SENTENCES_PER_VERBOSITY[verbosity]
  pool = FILLERS[topic]
  order = list(range(len(pool)))
  extras = [pool[i][int(technical)].format(**fmt) for i in sorted(rng.permutation(order)[: n - 1])]
  # The answer sentence comes first, so every response answers at once.
  return [answer] + extras


def _garble(sentence: str, rng: np.random.RandomState) -> str:
  words = sentence.rstrip(".").split()
  if len(words) < 3 or rng.rand() < 0.5:
    i = rng.randint(len(words))
    words = words[: i + 1] + [words[i]] * 3 + words[i + 1:]
  else:
    words = list(rng.permutation(words))
  return " ".join(words) + "."


def _math_item(rng):
  a, b = rng.randint(1, 10, size=2)
  op = rng.choice(["plus", "times"])
  truth = a + b if op == "plus" else a * b
  prompt = rng.choice([f"What is {a} {op} {b}?", f"Compute {a} {op} {b}.",
                       f"How much is {a} {op} {b}?"])
  return prompt, "math", truth, dict(a=a, b=b, op=op)


def _capital_item(rng):
  country, capital = CAPITALS[rng.randint(len(CAPITALS))]
  prompt = rng.choice([f"What is the capital of {country}?",
                       f"Which city is the capital of {country}?"])
  return prompt, "capital", capital, dict(country=country)


def _list_item(rng):
  category = rng.choice(sorted(CATEGORIES))
  k = rng.randint(2, 6)
  prompt = rng.choice([f"Name {NUMBER_WORDS[k]} {category}.",
                       f"List {NUMBER_WORDS[k]} {category}, please."])
  return prompt, "list", k, dict(category=category)


def _answer(topic, truth, fmt, correct, rng) -> str:
  if topic == "math":
    value = truth if correct else truth + int(rng.choice([-3, -2, -1, 1, 2, 4]))
    return f"{fmt['a']} {fmt['op']} {fmt['b']} is {value}."
  if topic == "capital":
    others = [c for _, c in CAPITALS if c != truth]
    city = truth if correct else others[rng.randint(len(others))]
    return f"The capital of {fmt['country']} is {city}."
  items = list(CATEGORIES[fmt["category"]])
  k = truth if correct else truth + int(rng.choice([-1, 1, 2]))
  chosen = [items[i] for i in rng.permutation(len(items))[:k]]
  return "Here they are: " + ", ".join(chosen) + "."


def _response(topic, truth, fmt, rng) -> tuple[str, dict]:
  """A response with random settings, and its five scores."""
  correct = rng.rand() < 0.7
  verbosity = int(rng.randint(5))
  technical = bool(rng.rand() < 0.4)
  garbled = rng.rand() < 0.2
  sentences = _sentences_for(topic, _answer(topic, truth, fmt, correct, rng), fmt,
                             verbosity, technical, rng)
  if garbled:
    i = rng.randint(len(sentences))
    sentences[i] = _garble(sentences[i], rng)
  correctness = 4 if correct else 0
  coherence = 1 if garbled else 4
  helpfulness = int(round((2 * correctness + coherence) / 3 - (1 if verbosity == 4 else 0)))
  return " ".join(sentences), dict(
      helpfulness=max(0, min(4, helpfulness)), correctness=correctness,
      coherence=coherence, complexity=3 if technical else 1, verbosity=verbosity)


def make_row(rng: np.random.RandomState) -> dict:
  """One HelpSteer-format row (prompt, response, five 0-4 attributes)."""
  maker = (_math_item, _capital_item, _list_item)[rng.randint(3)]
  prompt, topic, truth, fmt = maker(rng)
  response, scores = _response(topic, truth, fmt, rng)
  row = dict(prompt=str(prompt), response=response, **scores)
  if rng.rand() < 0.2:  # multi-turn, HelpSteer2 style: turns inside `prompt`
    first_prompt, topic0, truth0, fmt0 = _math_item(rng)
    first_answer = _answer(topic0, truth0, fmt0, True, rng)
    row["prompt"] = str(first_prompt) + TURN_ASSISTANT + first_answer + TURN_USER + prompt
  return row


def make_preference_row(rng: np.random.RandomState, split: str = "train") -> dict:
  """One HelpSteer2-Preference row: two responses to a prompt; the strength is
  the helpfulness difference (negative when response 1 is better), in -3..3."""
  maker = (_math_item, _capital_item, _list_item)[rng.randint(3)]
  prompt, topic, truth, fmt = maker(rng)
  (one, s1), (two, s2) = _response(topic, truth, fmt, rng), _response(topic, truth, fmt, rng)
  strength = int(np.clip(s2["helpfulness"] - s1["helpfulness"], -3, 3))
  return dict(split=split, prompt=str(prompt), response_1=one, response_2=two,
              preference_strength=strength)


def demo_rows(num_rows: int, seed: int) -> list[dict]:
  rng = np.random.RandomState(seed)
  return [make_row(rng) for _ in range(num_rows)]


def heldout_prompts(num_prompts: int = 50, seed: int = 10_000) -> list[str]:
  """Single-turn prompts from a seed the training split never uses."""
  rng = np.random.RandomState(seed)
  return [str((_math_item, _capital_item, _list_item)[i % 3](rng)[0])
          for i in range(num_prompts)]


def write_demo_dataset(out_dir: str | pathlib.Path, num_train: int = 2000,
                       num_validation: int = 200, seed: int = 0) -> pathlib.Path:
  """Writes `train.jsonl.gz` and `validation.jsonl.gz` as HelpSteer2 ships them."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  for split, n, s in (("train", num_train, seed), ("validation", num_validation, seed + 1)):
    path = out / f"{split}.jsonl.gz"
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
      for row in demo_rows(n, s):
        f.write(json.dumps(row) + "\n")
    tmp.replace(path)
  return out


def _preference_rows(num_train: int, num_validation: int, seed: int) -> Iterator[dict]:
  rng = np.random.RandomState(seed + 2)
  for i in range(num_train + num_validation):
    yield make_preference_row(rng, "train" if i < num_train else "validation")


def write_demo_preference(out_dir: str | pathlib.Path, num_train: int = 2000,
                          num_validation: int = 200, seed: int = 0) -> pathlib.Path:
  """Writes `preference/preference.jsonl.gz` (both splits) as HelpSteer2 ships it."""
  path = pathlib.Path(out_dir) / "preference" / "preference.jsonl.gz"
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  with gzip.open(tmp, "wt", encoding="utf-8") as f:
    for row in _preference_rows(num_train, num_validation, seed):
      f.write(json.dumps(row) + "\n")
  tmp.replace(path)
  return path


def rewardbench_subset(row: dict) -> str:
  """The RewardBench subset a demo pair stands in for: arithmetic is Reasoning
  (math-prm); the other pairs are Chat (alpacaeval-easy) when the helpfulness gap is 2
  or more, else Chat Hard (llmbar-natural)."""
  if _MATH_PROMPT.search(row["prompt"].split(TURN_USER)[-1]):
    return "math-prm"
  return "alpacaeval-easy" if abs(row["preference_strength"]) >= 2 else "llmbar-natural"


def write_demo_rewardbench(out_dir: str | pathlib.Path, num_train: int = 2000,
                           num_validation: int = 200, seed: int = 0) -> pathlib.Path:
  """Writes `rewardbench/filtered.jsonl`: the validation pairs of `write_demo_preference`
  (the same arguments give the same pairs; ties left out) in RewardBench's format
  (prompt, chosen, rejected, subset: `rewardbench_subset`)."""
  path = pathlib.Path(out_dir) / "rewardbench" / "filtered.jsonl"
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    for row in _preference_rows(num_train, num_validation, seed):
      if row["split"] != "validation" or row["preference_strength"] == 0:
        continue
      one, two = row["response_1"], row["response_2"]
      chosen, rejected = (one, two) if row["preference_strength"] < 0 else (two, one)
      f.write(json.dumps(dict(prompt=row["prompt"], chosen=chosen, rejected=rejected,
                              subset=rewardbench_subset(row))) + "\n")
  tmp.replace(path)
  return path


def corpus(num_rows: int = 3000, seed: int = 0) -> Iterator[str]:
  """Texts for training the demo tokenizer: rows as the SteerLM template renders
  them (system prompt, turn markers and label strings included), so the
  template costs few tokens."""
  from helpsteer_jax.data import template
  from helpsteer_jax.data.formats.helpsteer import helpsteer_conversation
  for row in demo_rows(num_rows, seed):
    scores = {k: row[k] for k in HELPSTEER_ATTRIBUTES}
    conv = helpsteer_conversation(row["prompt"], row["response"], scores)
    yield template.sft_text(conv)


# ---------------------------------------------------------------------------
# Scoring a response by the rules above (for evaluating steering without a
# trained attribute model).

_MATH_PROMPT = re.compile(r"([0-9]+) (plus|times) ([0-9]+)")
_CAPITAL_PROMPT = re.compile(r"capital of ([A-Z][a-z]+)")
_LIST_PROMPT = re.compile(r"(?:Name|List) ([a-z]+) ([a-z]+)")
_TECHNICAL = frozenset(s[1].split("{")[0] for pool in FILLERS.values() for s in pool)


def _sentences(response: str) -> list[str]:
  return [s for s in re.split(r"(?<=\.)\s+", response.strip()) if s]


def rule_correct(prompt: str, response: str) -> bool | None:
  """Whether the first sentence answers the (last) prompt right; None if the
  prompt is not one the generator makes."""
  prompt = prompt.split(TURN_USER)[-1]
  first = (_sentences(response) or [""])[0]
  if m := _MATH_PROMPT.search(prompt):
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    got = re.search(r" is (-?[0-9]+)\.?$", first)
    return bool(got) and int(got.group(1)) == (a + b if op == "plus" else a * b)
  if m := _CAPITAL_PROMPT.search(prompt):
    return first == f"The capital of {m.group(1)} is {dict(CAPITALS).get(m.group(1))}."
  if m := _LIST_PROMPT.search(prompt):
    if m.group(1) not in NUMBER_WORDS or m.group(2) not in CATEGORIES:
      return None
    items = first.removeprefix("Here they are: ").rstrip(".").split(", ")
    return (first.startswith("Here they are: ") and len(items) == NUMBER_WORDS.index(m.group(1))
            and set(items) <= set(CATEGORIES[m.group(2)]))
  return None


def rule_scores(prompt: str, response: str) -> dict[str, int]:
  """The five attributes as the generator assigns them, read back from text:
  correctness from the answer, verbosity from the sentence count (nearest
  level), complexity from technical filler sentences, coherence from a word
  repeated three times in a row (the generator's other garbling, shuffled
  words, is not detected), helpfulness by the generator's formula."""
  sentences = _sentences(response)
  correctness = 4 if rule_correct(prompt, response) else 0
  n = len(sentences)
  verbosity = min(range(5), key=lambda v: abs(SENTENCES_PER_VERBOSITY[v] - n))
  technical = any(s.startswith(p) for s in sentences[1:] for p in _TECHNICAL if p)
  words = response.replace(".", "").split()
  garbled = any(words[i] == words[i + 1] == words[i + 2] for i in range(len(words) - 2))
  coherence = 1 if garbled else 4
  helpfulness = int(round((2 * correctness + coherence) / 3 - (1 if verbosity == 4 else 0)))
  return dict(helpfulness=max(0, min(4, helpfulness)), correctness=correctness,
              coherence=coherence, complexity=3 if technical else 1, verbosity=verbosity)
