"""The scoring package: one protocol, one loader, fixed length buckets.

References: the regression input of NeMo-Aligner's process_to_regression_format
(data/template.py renders it; parsing a text must give back the same text),
the reward model scored on unpadded ids (padding to a bucket must not change a
prediction), and JAX's own compile events (no compile after warm-up).
"""

import ml_collections
import numpy as np
import pytest

from helpsteer_jax import config_sections, runtime
from helpsteer_jax.data import template
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.features.regression_ids import RegressionTokenizer
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import catalog, hf
from helpsteer_jax.models.reward import reward_model
from helpsteer_jax.scoring import load, remote, rewards, rules
from helpsteer_jax.scoring.model import ModelScorer, length_buckets
from helpsteer_jax.scoring.scorer import HostScorer, PrimaryScorer, predict
from helpsteer_jax.serve.backend import CompileCounter

CONV = Conversation("Be brief.", (Turn("User", "What is 2 plus 2?"), Turn("Assistant", "4."),
                                  Turn("User", "And 3 plus 3?"), Turn("Assistant", "It is 6.")))


def test_a_regression_text_parses_back_to_its_conversation():
  text = template.regression_text(CONV)
  parsed = template.parse_regression_text(text)
  assert [(t.role, t.text) for t in parsed.turns] == [(t.role, t.text) for t in CONV.turns]
  assert parsed.system == CONV.system and template.regression_text(parsed) == text
  for bad in ("no marker", text.removesuffix(template.LABEL_START),
              template.regression_text(Conversation("", (Turn("Assistant", "hi"),)))[:-3]):
    with pytest.raises(ValueError, match="attribute-model input"):
      template.parse_regression_text(bad)
  user_last = Conversation("s", (Turn("User", "q"),))
  with pytest.raises(ValueError, match="attribute-model input"):
    template.parse_regression_text(template.sft_text(user_last) + template.LABEL_START)


def test_a_rendered_steerlm_chat_parses_to_its_unlabelled_conversation():
  # What a SteerLM policy's prompt and answer decode to: sft_text of the labelled turns,
  # the last response closed by END_OF_TURN and TURN_START, or by one of them, or neither.
  labelled = Conversation(CONV.system, tuple(
      Turn(t.role, t.text, "quality:4,verbosity:1" if t.role == "Assistant" else None)
      for t in CONV.turns), mask_role="User")
  text = template.sft_text(labelled)
  assert text.endswith("It is 6.\n<extra_id_1>")
  prompt = template.generation_prompt(CONV, {"verbosity": 1})  # no label on earlier turns
  for rendered in (text, text.removesuffix(template.TURN_START),
                   text.removesuffix("\n" + template.TURN_START), prompt + "It is 6.",
                   template.regression_text(CONV)):
    parsed = template.parse_chat_text(rendered)
    assert [(t.role, t.text, t.label) for t in parsed.turns] == [
        (t.role, t.text, None) for t in CONV.turns], rendered
    assert parsed.system == CONV.system
  for bad, needle in (("no marker", "not a SteerLM chat"),
                      (text[:text.rindex("<extra_id_1>Assistant")], "assistant turn"),
                      (text.replace("verbosity:1\nIt is 6.", "verbosity:7\nIt is 6."),
                       "outside 0..4"),
                      (prompt.removesuffix("\n"), "has no end")):
    with pytest.raises(ValueError, match=needle):
      template.parse_chat_text(bad)


def test_length_buckets_are_powers_of_two_up_to_max_len():
  assert length_buckets(512) == (64, 128, 256, 512)
  assert length_buckets(300) == (64, 128, 256, 300)
  assert length_buckets(64) == (64,) and length_buckets(40) == (40,)


def test_rewards_weigh_predictions_and_keep_nan():
  preds = np.array([[1.0] * 9, [np.nan] * 9])
  got = rewards.rewards(preds, {"helpfulness": 2.0, "verbosity": -1.0})
  assert got[0] == pytest.approx(1.0) and np.isnan(got[1])
  np.testing.assert_array_equal(rewards.weight_vector([1] * 9), np.ones(9))
  with pytest.raises(ConfigError, match="one per attribute"):
    rewards.weight_vector([1, 2])
  weights = config_sections.helpsteer2_weights()
  assert weights["quality"] == 0.0 and len(weights) == 9


def test_host_and_primary_scorers_check_shapes_and_count_rows():
  host = HostScorer(rules.demo_rule_scores)
  out = host([CONV, CONV])
  assert out.shape == (2, len(ATTRIBUTES)) and out.dtype == np.float32
  assert host.local_rows == 2
  primary = PrimaryScorer(lambda convs: np.ones((len(convs), 9)))
  np.testing.assert_array_equal(primary([CONV]), np.ones((1, 9), np.float32))
  with pytest.raises(ConfigError, match="returned shape"):
    HostScorer(lambda convs: np.zeros((len(convs), 5)))([CONV])

  def fails(convs):
    raise ConfigError("the server answered 503")
  with pytest.raises(ConfigError, match="503"):
    PrimaryScorer(fails)([CONV])
  calls = []
  chunked = HostScorer(lambda convs: calls.append(len(convs)) or np.zeros((len(convs), 9)))
  assert predict([CONV] * 7, chunked, chunk=3).shape == (7, 9) and calls == [3, 3, 1]


def test_the_remote_item_keeps_an_empty_system_prompt():
  item = remote.reward_item(Conversation("", CONV.turns))
  assert item["messages"][0] == {"role": "system", "content": ""}
  assert [m["role"] for m in item["messages"]] == ["system", "user", "assistant", "user"]
  assert item["response"] == "It is 6."


def test_load_scorer_names_every_kind_of_source(tmp_path):
  section = config_sections.scorer_section()
  with pytest.raises(ConfigError, match="scorer.source is empty"):
    load.load_scorer(section, None)
  section.source = "demo_rules"
  assert isinstance(load.load_scorer(section, None), HostScorer)
  section.source = "http://127.0.0.1:1/v1"
  assert isinstance(load.load_scorer(section, None), PrimaryScorer)
  section.source = "127.0.0.1:8000"  # a URL without its scheme is not a factory
  assert not load.is_factory(section.source)
  with pytest.raises(ConfigError, match="base URL"):
    load.load_scorer(section, None)
  section.source = "helpsteer_jax.scoring.rules:nope"
  with pytest.raises(ConfigError, match="cannot be loaded"):
    load.load_scorer(section, None)
  section.source = str(tmp_path)  # a directory without a run
  with pytest.raises(ConfigError, match="no tokenizer files|no Orbax checkpoint"):
    load.load_scorer(section, runtime.setup(_mesh_config()))


def _mesh_config():
  config = ml_collections.ConfigDict({"mesh": {"data": 1, "fsdp": -1, "tensor": 1},
                                      "sharding_rules": ()})
  from helpsteer_jax import sharding
  config.sharding_rules = tuple(sharding.DEFAULT_RULES)
  return config


@pytest.fixture(scope="module")
def model_scorer(tmp_path_factory):
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path_factory.mktemp("tok")))
  model = reward_model(catalog.model_config("tiny", hidden_size=32, intermediate_size=64,
                                            num_layers=2, num_heads=2, num_kv_heads=1), seed=3)
  model.head.kernel[...] = np.random.default_rng(0).normal(
      size=model.head.kernel[...].shape).astype(np.float32)
  rt = runtime.setup(_mesh_config())
  return ModelScorer(model, rt, RegressionTokenizer(tok, 256), batch_size=8), model


def test_bucket_padding_does_not_change_predictions(model_scorer):
  scorer, model = model_scorer
  convs = [Conversation("s", (Turn("User", "q" * i), Turn("Assistant", "a " * (9 * i))))
           for i in (1, 5, 12, 22)]
  got = scorer(convs)
  for conv, row in zip(convs, got):
    ids = scorer.tok.ids(conv)
    n = len(ids)
    want = model.score_last(ids[None], np.arange(n)[None], np.ones((1, n), np.int32))
    np.testing.assert_allclose(row, np.asarray(want)[0], rtol=1e-5, atol=1e-5)
  lengths = {scorer.bucket(len(scorer.tok.ids(c))) for c in convs}
  assert len(lengths) >= 3  # the inputs span several buckets


def test_no_compile_after_warm_up_whatever_the_lengths(model_scorer):
  scorer, _ = model_scorer
  steps = []
  scorer.warm_up(lambda: steps.append(scorer.compiled_variants))
  # A step per length bucket, after which every bucket's program is compiled.
  assert len(steps) == len(scorer.buckets) and steps[-1] == scorer.warm_up_programs
  counter = CompileCounter()
  for words in (1, 3, 9, 20, 44, 70, 100):
    conv = Conversation("s", (Turn("User", "count"), Turn("Assistant", "w " * words)))
    assert not np.isnan(scorer([conv] * (1 + words % 5))).any()
  assert counter.count == 0
  too_long = Conversation("s", (Turn("User", "q"), Turn("Assistant", "w " * 400)))
  assert np.isnan(scorer([too_long, CONV])[0]).all()  # does not fit max_len after truncation


def test_reward_rows_put_a_scalar_reward_in_the_reward_slot():
  from helpsteer_jax.scoring.scorer import REWARD_SLOT, reward_rows
  out = reward_rows([2.5, np.nan, -100.0])
  assert out.shape == (3, len(ATTRIBUTES)) and out.dtype == np.float32
  slot = ATTRIBUTES.index(REWARD_SLOT)
  np.testing.assert_array_equal(out[[0, 2], slot], [2.5, -100.0])
  assert np.isnan(out[1]).all()
  np.testing.assert_array_equal(np.delete(out[[0, 2]], slot, axis=1), 0.0)
  weights = {name: float(name == REWARD_SLOT) for name in ATTRIBUTES}
  np.testing.assert_array_equal(rewards.rewards(out[[0, 2]], weights), [2.5, -100.0])


def test_context_groups_are_runs_of_answers_to_the_same_context():
  from helpsteer_jax.inference import steering
  from helpsteer_jax.scoring.scorer import context_groups
  a = steering.make_request("What is 2 + 2?", {})
  b = steering.make_request("Name a colour.", {})
  convs = [a.answered("4"), a.answered("four"), b.answered("red"), a.answered("5")]
  assert context_groups(convs) == [[0, 1], [2], [3]]
  assert context_groups([]) == []


def test_a_requests_reference_travels_to_the_scored_conversation():
  from helpsteer_jax.inference import steering
  ref = {"scores": [3, 4], "ranking": 4}
  req = steering.make_request("Judge these.", {}, extra={"reference": ref, "id": 7})
  assert req.answered("\\boxed{3, 4} \\boxed{4}").reference == ref
  assert steering.make_request("Plain.", {}).answered("x").reference is None
