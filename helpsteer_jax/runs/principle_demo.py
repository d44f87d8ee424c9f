"""The principle judge's CPU demo data: HelpSteer3 principle rows whose verdict follows
from the text (`data.demo.helpsteer3.make_principle_row`) and the answer-format examples a
small policy learns first by AC-SFT.

Each example answers a training row's judge prompt (`judges.principle.prompt_row`, as
`prompts.format=principle` reads it) with one sentence of reasoning, the principle's
claim for a response that fulfils it or for one that does not, then the judgement that
claim implies (`judges.principle.answer`). The claim is drawn at random, not read from
the response: the examples teach the format (a claim, then the verdict it implies), and
RL with the verifier's reward teaches which claim the response bears out. The examples
are SteerLM conversations with an empty label, as the RL task renders a judge prompt (no
attribute label: a judgement is not steered).

  python -m helpsteer_jax.runs.principle_demo workdir/principle_demo
"""

from __future__ import annotations

import pathlib

import numpy as np

from helpsteer_jax.data.demo import helpsteer3 as demo_helpsteer3
from helpsteer_jax.data.formats import helpsteer, helpsteer3
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.data.template import DEFAULT_SYSTEM
from helpsteer_jax.judges import principle

FORMAT_EXAMPLES = demo_helpsteer3.FORMAT_EXAMPLES


def format_rows(source: str, split: str, seed: int) -> list[dict]:
  """SteerLM rows: each principle row's judge prompt answered by a random claim of its
  principle and the verdict that claim implies."""
  claims = {p.text: p for p in demo_helpsteer3.PRINCIPLES}
  rng = np.random.RandomState(seed)
  out = []
  for record in helpsteer3.read_helpsteer3(source, "principle", split):
    fulfilled = bool(rng.rand() < 0.5)
    demo = claims[record.principle]
    text = principle.answer(fulfilled, demo.yes_claim if fulfilled else demo.no_claim)
    turns = (Turn("User", principle.prompt_row(record)["prompt"]),
             Turn("Assistant", text, ""))
    out.append(helpsteer.steerlm_row(Conversation(system=DEFAULT_SYSTEM, turns=turns)))
  return out


def write_demo(out_dir: str | pathlib.Path, num_train: int = 2000,
               num_validation: int = 200) -> pathlib.Path:
  """The demo's `principle/` config and, in `FORMAT_EXAMPLES/`, answer-format rows for an
  AC-SFT run."""
  out = demo_helpsteer3.write_demo_principle(out_dir, num_train, num_validation)
  demo_helpsteer3.write_format_examples(
      out, lambda split, seed: format_rows(str(out), split, seed))
  return out


if __name__ == "__main__":
  import sys
  print(write_demo(sys.argv[1] if len(sys.argv) > 1 else "workdir/principle_demo"))
