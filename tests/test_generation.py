"""Text generation: stop strings and EOS, steering input, best-of-n, chat, loading.

Models are tiny and random; the tokenizer is the demo BPE tokenizer (its
SteerLM markers are single tokens, so `<extra_id_1>` is a stop id).
"""

import io
import json
import runpy

import jax
import numpy as np
import pytest
from flax import nnx

from helpsteer_jax import config_base, sharding
from helpsteer_jax.config_sections import scorer_section
from helpsteer_jax.data import template
from helpsteer_jax.data.demo import rows as demo
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError, DataError
from helpsteer_jax.inference import (
  best_of_n,
  chat,
  generator,
  row_stream,
  steering,
)
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.load import model as loader
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.scoring import rewards as rewards_lib
from helpsteer_jax.scoring.load import load_scorer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path_factory.mktemp("tok")))


def _mesh():
  return sharding.make_mesh((1, 1, 1), jax.devices()[:1])


def _generator(tokenizer, stop_strings=generator.DEFAULT_STOP_STRINGS, **cfg):
  cfg = catalog.model_config("tiny", initializer_range=0.1, **cfg)
  engine = generator.make_engine(builder.create(cfg, seed=0), _mesh(), tokenizer, max_batch=4,
                                 max_length=96, stop_strings=stop_strings)
  return generator.Generator(engine)


PROMPT = template.generation_prompt(
    steering.make_request("What is 2 plus 3?", {"verbosity": 2}).conversation, {"verbosity": 2})


def test_stop_ids_from_strings(tokenizer):
  marker = tokenizer.convert_tokens_to_ids("<extra_id_1>")
  # "capital of" is several tokens: the engine ends a row when its text holds it.
  stop = generator.stop_ids(tokenizer, ["<extra_id_1>", "capital of"], eos_ids=[2])
  assert stop == tuple(sorted({2, marker}))
  assert row_stream.cut_at_stop("abc<extra_id_1>User", ["<extra_id_1>", "User"]) == ("abc", True)
  assert row_stream.cut_at_stop("abc", ["<extra_id_1>"]) == ("abc", False)


def test_stop_string_and_eos_end_generation_and_are_stripped(tokenizer):
  free = _generator(tokenizer, stop_strings=())
  base = free.complete([PROMPT], max_new_tokens=24)[0]
  assert base.finish_reason == "length" and len(base.token_ids) == 24
  # A stop string made of generated tokens 4..5 ends the text right before it.
  stop_text = tokenizer.decode(base.token_ids[4:6])
  stopped = _generator(tokenizer, stop_strings=(stop_text,)).complete([PROMPT], 24)[0]
  assert stopped.finish_reason == "stop"
  assert stop_text not in stopped.text
  assert stopped.text == base.text[: base.text.index(stop_text)]
  assert len(stopped.token_ids) < 24
  # An EOS id (the token generated at step 3) ends it too and is not shown.
  eos = base.token_ids[3]
  by_eos = _generator(tokenizer, stop_strings=(), eos_token_id=eos).complete([PROMPT], 24)[0]
  assert by_eos.finish_reason == "stop" and by_eos.token_ids[-1] == eos
  first_eos = base.token_ids.index(eos)
  assert by_eos.token_ids == base.token_ids[: first_eos + 1]
  assert by_eos.text == tokenizer.decode(base.token_ids[:first_eos], skip_special_tokens=False)


def test_response_text_drops_the_turn_end_before_the_marker():
  assert steering.response_text("Paris.\n", "stop") == "Paris."
  assert steering.response_text("Paris.\n", "length") == "Paris.\n"


def test_bad_input_gives_clear_errors(tmp_path, tokenizer):
  gen = _generator(tokenizer)
  with pytest.raises(ConfigError, match="prompt 0 is empty"):
    gen.complete([""], 4)
  with pytest.raises(ConfigError, match="exceeds the KV cache length 96"):
    gen.complete([PROMPT * 8], 4)
  rows = [{"prompt": "Hi"}, {"prompt": "  "}, {"prompt": "x", "attributes": {"verbosity": 5}},
          {"prompt": "x", "attributes": {"verbosty": 1}}, {"text": "x"}]
  for line, row in enumerate(rows[1:], 2):
    path = tmp_path / f"bad{line}.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=f"bad{line}.jsonl:2") as err:
      steering.read_requests(str(path), steering.NEMO_DEFAULTS)
    print(err.value)
  msgs = []
  for row in rows[2:4]:
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError) as err:
      steering.read_requests(str(path), {})
    msgs.append(str(err.value))
  assert "outside 0..4" in msgs[0] and "unknown attribute" in msgs[1] and "verbosty" in msgs[1]
  config = _task_config()
  config.steer.verbosity = 7
  with pytest.raises(ConfigError, match="config.steer: .*verbosity.* outside 0..4"):
    steering.run_attributes(config)
  config.steer.verbosity = 1
  config.steer_attributes = "helpfulness,wit"
  with pytest.raises(ConfigError, match="unknown attribute"):
    steering.run_attributes(config)


def _task_config():
  import runpy

  from conftest import REPO_ROOT
  return runpy.run_path(str(REPO_ROOT / "configs" / "generate.py"))["get_config"]()


def test_requests_from_jsonl_text_and_stdin(tmp_path):
  config = _task_config()
  config.steer_attributes = "helpsteer"
  defaults = steering.run_attributes(config)
  assert defaults == dict(helpfulness=4, correctness=4, coherence=4, complexity=4, verbosity=4)
  path = tmp_path / "in.jsonl"
  path.write_text(json.dumps({"prompt": "Name two fruits.", "id": 7,
                              "attributes": {"verbosity": 0}}) + "\n"
                  + json.dumps({"prompt": "Hi", "attributes": "verbosity:1,humor:2",
                                "response": "Hello.", "helpfulness": 3}) + "\n")
  first, second = steering.read_requests(str(path), defaults)
  # A HelpSteer2 row's own answer and labels are not the generated answer's.
  assert second.output_row("Hey!") == {"prompt": "Hi", "attributes": second.attributes,
                                       "response": "Hey!"}
  assert first.attributes["verbosity"] == 0 and first.attributes["helpfulness"] == 4
  assert first.output_row("ok") == {"prompt": "Name two fruits.", "id": 7,
                                    "attributes": first.attributes, "response": "ok"}
  assert second.attributes["humor"] == 2
  prompt = first.prompt_text()
  assert prompt.endswith("<extra_id_1>Assistant\n<extra_id_2>helpfulness:4,correctness:4,"
                         "coherence:4,complexity:4,verbosity:0\n")
  text = tmp_path / "in.txt"
  text.write_text("What is 2 plus 2?\n\nName three colors.\n")
  assert [r.prompt for r in steering.read_requests(str(text), defaults)] == [
      "What is 2 plus 2?", "Name three colors."]
  stdin = io.StringIO('{"prompt": "a"}\n{"prompt": "b"}\n')
  assert [r.prompt for r in steering.read_requests("-", defaults, stdin=stdin)] == ["a", "b"]
  nemo = _task_config()
  nemo.steer_attributes = "all"
  assert template.label_string(steering.run_attributes(nemo)) == (
      "quality:4,toxicity:0,humor:0,creativity:0,helpfulness:4,correctness:4,coherence:4,"
      "complexity:4,verbosity:4")


class LengthScorer:
  """Test double: predictions from the response length, deterministically."""

  def __init__(self):
    self.convs, self.local_rows = [], 0

  def __call__(self, convs):
    self.convs += list(convs)
    out = np.zeros((len(convs), len(ATTRIBUTES)), np.float32)
    for i, c in enumerate(convs):
      response = c.turns[-1].text
      out[i, ATTRIBUTES.index("helpfulness")] = len(response) % 7
      out[i, ATTRIBUTES.index("verbosity")] = len(response) % 5
    return out


def test_best_of_n_keeps_the_highest_weighted_reward(tokenizer):
  gen = _generator(tokenizer, stop_strings=())
  req = steering.make_request("What is 2 plus 3?", {"verbosity": 2})
  scorer = LengthScorer()
  weights = rewards_lib.weight_vector({"helpfulness": 1.0, "verbosity": -0.5})
  hot = SamplingConfig(temperature=1.0)
  other = steering.make_request("Name two fruits.", {"verbosity": 0})
  result, second = best_of_n.best_of_n(gen, [req, other], 4, scorer, weights, 12, hot, seed=3)
  assert len(result.candidates) == 4 and len(second.candidates) == 4
  assert second.best == int(np.argmax([c.reward for c in second.candidates]))
  assert "Name two fruits." in template.regression_text(scorer.convs[4])
  assert len({c.response for c in result.candidates}) > 1
  rewards = [c.reward for c in result.candidates]
  assert result.best == int(np.argmax(rewards))
  for c, conv in zip(result.candidates, scorer.convs):
    assert template.regression_text(conv) == template.regression_text(
        req.conversation.__class__(req.conversation.system, req.conversation.turns
                                   + (template.Turn("Assistant", c.response),)))
    n = len(c.response)
    assert c.scores["helpfulness"] == n % 7 and c.scores["verbosity"] == n % 5
    assert c.reward == pytest.approx(n % 7 - 0.5 * (n % 5))
  with pytest.raises(ConfigError, match="needs sampling"):
    best_of_n.best_of_n(gen, [req], 2, scorer, weights, 4, SamplingConfig())
  with pytest.raises(ConfigError, match="unknown attribute"):
    rewards_lib.weight_vector({"wit": 1.0})


def test_file_mode_resumes_mid_batch_as_an_uninterrupted_run(tmp_path, tokenizer):
  from helpsteer_jax.runs import generation
  from helpsteer_jax.tasks import generate as generate_task
  config = _task_config()
  config.batch_size, config.max_new_tokens, config.seed = 2, 6, 5
  config.sampling.temperature = 1.0
  sampling = generation.sampling_config(config)
  gen = _generator(tokenizer)
  requests = [steering.make_request(p, {"verbosity": i % 5}, extra={"id": i})
              for i, p in enumerate(demo.heldout_prompts(7))]
  full = tmp_path / "full.jsonl"
  assert generate_task.answer_all(gen, requests, config, sampling, full) == 0
  lines = full.read_text().splitlines(keepends=True)
  assert len(lines) == 7
  part = tmp_path / "part.jsonl"
  part.write_text("".join(lines[:3]) + lines[3][:25])  # killed writing row 4, mid-batch
  assert generate_task.answer_all(gen, requests, config, sampling, part) == 3
  assert part.read_bytes() == full.read_bytes()
  assert generate_task.answer_all(gen, requests, config, sampling, part) == 7
  assert part.read_bytes() == full.read_bytes()
  # Row i samples with seed + i, so its answer does not depend on where batches start.
  alone = generate_task._answer_batch(gen, requests[3:5], config, sampling, config.seed + 3,
                                      None, None)
  assert [json.loads(line)["response"] for line in lines[3:5]] == [r["response"] for r in alone]
  shifted = generate_task._answer_batch(gen, requests[3:5], config, sampling, config.seed + 4,
                                        None, None)
  assert [r["response"] for r in alone] != [r["response"] for r in shifted]
  other = tmp_path / "other.jsonl"
  other.write_text(lines[0] + lines[2])
  with pytest.raises(ConfigError, match="another input"):
    generate_task.answer_all(gen, requests, config, sampling, other)


def test_demo_rule_scorer_reads_the_demo_rules():
  scorer = load_scorer(scorer_section(source="demo_rules"), None)
  rows = demo.demo_rows(40, seed=5)
  convs = [steering.make_request(r["prompt"], {}).conversation.answered(r["response"])
           for r in rows]
  scores = scorer(convs)
  assert scores.shape == (40, 9)
  for row, s in zip(rows, scores):
    assert s[ATTRIBUTES.index("verbosity")] == row["verbosity"]
    if row["coherence"] == 4:  # a garbled answer sentence is not read as correct
      assert s[ATTRIBUTES.index("correctness")] == row["correctness"]
  assert demo.rule_correct("What is 3 times 4?", "3 times 4 is 12. Start with 3.")
  assert not demo.rule_correct("What is 3 times 4?", "3 times 4 is 13.")
  with pytest.raises(ConfigError, match="cannot be loaded"):
    load_scorer(scorer_section(source="helpsteer_jax.no_such_module:load"), None)


def test_chat_keeps_history_and_changes_attributes():
  prompts = []

  def respond(prompt):
    prompts.append(prompt)
    return f"answer {len(prompts)}"

  script = "hello\n/set verbosity=1\n/set verbosity=9\n/set wit=2\n/bogus\nmore\n/quit\n"
  out = io.StringIO()
  conv = chat.chat(respond, {"helpfulness": 4, "verbosity": 4}, inp=io.StringIO(script),
                   out=out)
  assert [t.text for t in conv.turns] == ["hello", "answer 1", "more", "answer 2"]
  assert conv.turns[1].label == "helpfulness:4,verbosity:4"
  assert conv.turns[3].label == "helpfulness:4,verbosity:1"
  assert prompts[1] == template.generation_prompt(conv, {"helpfulness": 4, "verbosity": 1})
  log = out.getvalue()
  assert "outside 0..4" in log and "unknown attribute" in log and "unknown command" in log
  assert "Assistant> answer 2" in log


def test_loads_params_from_a_training_checkpoint(tmp_path):
  import optax

  from helpsteer_jax.data import pipeline
  from helpsteer_jax.data.features.next_token import next_token_features
  from helpsteer_jax.train import checkpoint as ckpt_lib
  from helpsteer_jax.train import state as state_lib
  config = _task_config()
  config.mesh = config_base.mesh_config(2, 2, 2)  # saved on 4 devices, loaded on 8
  rt_mesh = sharding.make_mesh((1, 2, 2), jax.devices()[:4])
  shape = dict(hidden_size=32, intermediate_size=96, num_layers=3)  # not the named model's
  model = builder.init_model(catalog.model_config("tiny", **shape), rt_mesh,
                             sharding.DEFAULT_RULES, 4)
  want = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))
  parts = state_lib.split_model(model, rt_mesh, sharding.DEFAULT_RULES)  # donated below
  state, _ = state_lib.create_train_state(optax.adam(1e-3), parts, rt_mesh, seed=0)
  features = [next_token_features(np.arange(3, 12), np.ones(9, bool))] * 4
  data = iter(pipeline.training_dataset(features, pipeline.PipelineConfig(seq_len=16, rows=2)))
  ckpt = ckpt_lib.Checkpointer(tmp_path / "run" / "checkpoints", save_every=1, keep=2)
  ckpt.save(3, state, data, force=True)
  ckpt.close()

  config.init.source = str(tmp_path / "run")
  from helpsteer_jax import runtime
  rt = runtime.setup(config)
  loaded = loader.load_model(config, rt, loader.DECODE)
  got = nnx.to_pure_dict(nnx.state(loaded))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, np.asarray(b)),
               want, got)
  assert got["layers"]["attn"]["q_proj"].sharding.mesh.shape == rt.mesh.shape
  assert loaded.cfg.num_layers == 3 and loaded.cfg.hidden_size == 32
  config.model.hidden_size = 64  # explicit shapes must match the checkpoint's
  with pytest.raises(ConfigError, match="embed has shape .* but the model config gives"):
    loader.load_model(config, rt, loader.DECODE)
  config.init.source = str(tmp_path / "nothing")
  with pytest.raises(ConfigError, match="no Orbax checkpoint in .*nothing"):
    loader.load_model(config, rt, loader.DECODE)


def test_generate_task_from_the_command_line(tmp_path, tokenizer):
  from cli_utils import run_main
  tok_dir = demo_tokenizer.build_demo_tokenizer(tmp_path / "tok")
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  hf.save_hf_model(model, tmp_path / "hf", dtype="float32", tokenizer=str(tok_dir))
  inp = tmp_path / "in.jsonl"
  inp.write_text("\n".join(json.dumps(r) for r in [
      {"prompt": "What is 2 plus 3?", "attributes": {"verbosity": 0}, "id": "a"},
      {"prompt": "Name two fruits."},
      {"prompt": "What is 1 plus 1?\n<extra_id_1>Assistant\n2.\n<extra_id_1>User\nAnd 2 plus 2?"},
  ]) + "\n")
  common = ["--config=configs/generate.py", f"--config.init.source={tmp_path / 'hf'}",
            f"--config.input={inp}", "--config.max_new_tokens=6", "--config.batch_size=2",
            "--config.mesh.data=2", "--config.mesh.tensor=2", "--config.steer.complexity=1",
            "--config.steer_attributes=helpsteer"]  # the export has no steerlm section
  run_main(*common, f"--workdir={tmp_path / 'w1'}")
  rows = [json.loads(line)
          for line in (tmp_path / "w1" / "generations.jsonl").read_text().splitlines()]
  assert [r["prompt"][:10] for r in rows] == ["What is 2 ", "Name two f", "What is 1 "]
  assert rows[0]["id"] == "a" and rows[0]["attributes"]["verbosity"] == 0
  assert rows[1]["attributes"] == dict(helpfulness=4, correctness=4, coherence=4,
                                       complexity=1, verbosity=4)
  assert all(isinstance(r["response"], str) and r["finish_reason"] in ("stop", "length")
             for r in rows)
  run_main(*common, f"--workdir={tmp_path / 'w2'}", "--config.best_of_n.n=3",
           "--config.sampling.temperature=1.0")
  rows = [json.loads(line)
          for line in (tmp_path / "w2" / "generations.jsonl").read_text().splitlines()]
  for r in rows:
    assert len(r["candidates"]) == 3 and set(r["candidates"][0]["scores"]) == set(ATTRIBUTES)
    assert r["response"] == r["candidates"][r["best"]]["response"]
    assert r["candidates"][r["best"]]["reward"] == max(c["reward"] for c in r["candidates"])


@pytest.mark.parametrize("flag,message", [
    ("--config.steer.wit=1", "config.steer has keys"),
    ("--config.steer.verbosity=9", "config.steer: score of 'verbosity' is 9, outside 0..4"),
])
def test_generate_task_rejects_bad_attributes_before_loading(tmp_path, flag, message):
  from cli_utils import run_main
  proc = run_main("--config=configs/generate.py", f"--workdir={tmp_path}", flag, check=False)
  assert proc.returncode == 2 and message in proc.stderr


def test_chat_mode_of_the_task(tmp_path, monkeypatch, capsys):
  from helpsteer_jax.tasks import generate as generate_task
  tok_dir = demo_tokenizer.build_demo_tokenizer(tmp_path / "tok")
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  hf.save_hf_model(model, tmp_path / "hf", dtype="float32", tokenizer=str(tok_dir))
  config = _task_config()
  config.init.source = str(tmp_path / "hf")
  config.mode, config.max_new_tokens = "chat", 5
  config.steer_attributes = "helpsteer"  # the export has no steerlm section
  config.mesh = config_base.mesh_config(1, -1, 2)
  monkeypatch.setattr("sys.stdin", io.StringIO("What is 2 plus 2?\n/set verbosity=0\n"
                                               "And 3 plus 3?\n/show\n"))
  generate_task.run(config, str(tmp_path / "w"))
  out = capsys.readouterr().out
  assert out.count("Assistant> ") == 2
  assert "attributes: helpfulness:4,correctness:4,coherence:4,complexity:4,verbosity:0" in out


def test_generation_presets_decode_in_float32_on_cpu():
  from helpsteer_jax import runtime

  from conftest import REPO_ROOT
  for task in ("generate", "serve"):
    config = runpy.run_path(str(REPO_ROOT / "configs" / f"{task}.py"))["get_config"](
        "smollm2_135m")
    assert config.model.dtype == config.model.param_dtype == "auto"
    cfg = runtime.build_model_config(config.model)
    assert (cfg.dtype, cfg.param_dtype) == ("float32", "float32")  # this suite runs on CPU
  assert runtime.decode_dtype("bfloat16") == "bfloat16"
