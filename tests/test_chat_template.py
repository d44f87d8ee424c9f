"""The SteerLM chat template of AC-SFT / 2D-DPO exports.

Reference: transformers' own `AutoTokenizer.from_pretrained(export).apply_chat_template`
(the path vLLM and SGLang take) against `data.template`'s rendering, byte for
byte, on the demo BPE tokenizer and mistral-common's real SentencePiece model.
"""

import json
import shutil

import jinja2
import jinja2.sandbox
import ml_collections
import pytest
import transformers

from helpsteer_jax import weights
from helpsteer_jax.data import chat_template, template
from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.data.formats import helpsteer
from helpsteer_jax.data.records import ATTRIBUTES, HELPSTEER_ATTRIBUTES, Conversation, Turn
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import steering
from helpsteer_jax.models import builder, catalog, hf

from cli_utils import TINY_RUN, run_main

SPECS = {
    "all": chat_template.SteerSpec.nemo(ATTRIBUTES),
    "helpsteer": chat_template.SteerSpec.nemo(HELPSTEER_ATTRIBUTES),
    "subset": chat_template.SteerSpec(("humor", "verbosity"), {"verbosity": 2, "humor": 1}),
}
SYSTEM = {"role": "system", "content": "You answer in one line."}
HISTORY = [{"role": "user", "content": "What is 7 times 8?"},
           {"role": "assistant", "content": "56."},
           {"role": "user", "content": "And 9 times 9? Ünïcödé 🙂"}]
ROLES = {"user": "User", "assistant": "Assistant"}


@pytest.fixture(scope="module", params=["demo", "sentencepiece"])
def base_export(request, tmp_path_factory):
  """An HF export (tiny model) with the demo BPE or the SentencePiece tokenizer."""
  out = tmp_path_factory.mktemp(request.param)
  if request.param == "demo":
    tok_dir = demo_tokenizer.build_demo_tokenizer(out / "tok")
  else:
    tok_dir = request.getfixturevalue("sentencepiece_dir")
  vocab = len(hf.load_tokenizer(tok_dir))
  model = builder.create(catalog.model_config("tiny", vocab_size=vocab), seed=0)
  hf.save_hf_model(model, out / "hf", dtype="float32", tokenizer=str(tok_dir))
  return out / "hf"


def test_a_bare_sentencepiece_model_is_exported_with_its_class(sentencepiece_dir, tmp_path):
  """Reference: the `sentencepiece` library. AutoTokenizer on the export must keep the
  dummy prefix space that `hf.load_tokenizer` (training) keeps."""
  import sentencepiece
  model = builder.create(catalog.model_config("tiny", vocab_size=32000), seed=0)
  hf.save_hf_model(model, tmp_path / "hf", dtype="float32", tokenizer=str(sentencepiece_dir))
  sp = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_dir / "tokenizer.model"))
  text = "<extra_id_0>System\nWhat is 7 times 8? Ünïcödé 🙂\n"
  tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  assert tok(text, add_special_tokens=False).input_ids == sp.encode(text)


def _export(base, spec, tmp_path, add_bos=True):
  out = tmp_path / "export"
  shutil.copytree(base, out)
  chat_template.export_files(spec, out, add_bos=add_bos)
  return out


def _conversation(messages) -> Conversation:
  system, rest = template.DEFAULT_SYSTEM, list(messages)
  if rest and rest[0]["role"] == "system":
    system, rest = rest[0]["content"], rest[1:]
  labels = [m.get("label") for m in rest]
  labels = [template.label_string(x if isinstance(x, dict) else template.parse_label_string(x))
            if x is not None else None for x in labels]
  return Conversation(system=system, mask_role="User", turns=tuple(
      Turn(ROLES[m["role"]], m["content"], label) for m, label in zip(rest, labels)))


def _given(attributes) -> dict:
  if attributes is None:
    return {}
  return template.parse_label_string(attributes) if isinstance(attributes, str) else attributes


CASES = [  # (messages, attributes)
    (HISTORY[:1], None),
    ([SYSTEM, *HISTORY], None),
    (HISTORY, {"verbosity": 0, "helpfulness": 2}),  # not in canonical order
    ([SYSTEM, *HISTORY], "verbosity:1, humor:3"),   # a label string, spaces as NeMo allows
    ([HISTORY[0], dict(HISTORY[1], label={"verbosity": 0, "quality": 4}), HISTORY[2]],
     {"complexity": 0}),
    ([HISTORY[0], dict(HISTORY[1], label="verbosity:0,helpfulness:3"), HISTORY[2]], ""),
]


@pytest.mark.parametrize("spec_name", list(SPECS))
def test_generation_prompt_is_the_template_modules(base_export, spec_name, tmp_path):
  spec = SPECS[spec_name]
  export = _export(base_export, spec, tmp_path)
  tok = transformers.AutoTokenizer.from_pretrained(export)
  bos = tok.bos_token
  assert bos == "<s>"
  for messages, attributes in CASES:
    kwargs = {} if attributes is None else {"attributes": attributes}
    got = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    want = template.generation_prompt(_conversation(messages),
                                      {**spec.defaults, **_given(attributes)})
    assert got == bos + want, (messages, attributes)
  # Defaults alone: the model's attributes in canonical order with their defaults.
  assert tok.apply_chat_template(HISTORY[:1], add_generation_prompt=True, tokenize=False
                                 ).endswith(f"<extra_id_2>{template.label_string(spec.defaults)}\n")


def test_the_rendered_prompt_tokenizes_as_training_and_generation_do(base_export, tmp_path,
                                                                    request):
  """Servers tokenize the rendered chat without adding special tokens; the ids must be
  those of `tokenize_pieces` with the BOS (training, `generate`)."""
  if base_export.parent.name.startswith("sentencepiece"):
    request.applymarker(pytest.mark.xfail(strict=True, reason=(
        "transformers' Llama tokenizer adds no SentencePiece dummy prefix after the BOS"
        " token in the text: '<s><extra_id_0>' starts with '<', not '▁<' as"
        " [BOS] + encode(prompt) does")))
  export = _export(base_export, SPECS["helpsteer"], tmp_path)
  tok = transformers.AutoTokenizer.from_pretrained(export)
  ours = hf.load_tokenizer(export)
  for messages, attributes in CASES:
    ids = tok.apply_chat_template(messages, attributes=attributes, add_generation_prompt=True,
                                  tokenize=True)["input_ids"]
    prompt = template.generation_prompt(_conversation(messages), {
        **SPECS["helpsteer"].defaults, **_given(attributes)})
    want = tokenize.tokenize_pieces([template.Piece(prompt, False)], ours, add_bos=True).ids
    assert list(ids) == [int(i) for i in want]
  no_bos = _export(base_export, SPECS["helpsteer"], tmp_path / "no_bos", add_bos=False)
  text = transformers.AutoTokenizer.from_pretrained(no_bos).apply_chat_template(
      HISTORY[:1], add_generation_prompt=True, tokenize=False)
  assert text.startswith(template.SYSTEM_START)


def test_whole_conversation_is_the_sft_text(base_export, tmp_path):
  """Without a generation prompt: `template.sft_text`, a final assistant message labelled
  with `attributes` unless it has its own label (the response being continued)."""
  spec = SPECS["helpsteer"]
  tok = transformers.AutoTokenizer.from_pretrained(_export(base_export, spec, tmp_path))
  answered = [SYSTEM, *HISTORY, {"role": "assistant", "content": "81."}]
  got = tok.apply_chat_template(answered, attributes={"verbosity": 1}, tokenize=False)
  conv = _conversation(answered)
  label = template.label_string({**spec.defaults, "verbosity": 1})
  conv = Conversation(conv.system, (*conv.turns[:-1], Turn("Assistant", "81.", label)))
  assert got == "<s>" + template.sft_text(conv)
  own = [*HISTORY, {"role": "assistant", "content": "81.", "label": "humor:0"}]
  assert tok.apply_chat_template(own, tokenize=False) == "<s>" + template.sft_text(
      _conversation(own))
  assert tok.apply_chat_template(HISTORY, tokenize=False) == "<s>" + template.sft_text(
      _conversation(HISTORY))
  # Prefill: transformers cuts the text after the final message's content.
  prefill = tok.apply_chat_template([*HISTORY, {"role": "assistant", "content": "It is"}],
                                    continue_final_message=True, tokenize=False)
  label = template.label_string(spec.defaults)
  assert prefill.endswith(f"<extra_id_1>Assistant\n<extra_id_2>{label}\nIt is")


def test_an_export_trained_without_labels_writes_none_unless_asked(base_export, tmp_path):
  tok = transformers.AutoTokenizer.from_pretrained(
      _export(base_export, chat_template.NO_LABELS, tmp_path))
  conv = _conversation(HISTORY[:1])
  text = tok.apply_chat_template(HISTORY[:1], add_generation_prompt=True, tokenize=False)
  assert text == "<s>" + template.sft_text(conv) + "<extra_id_1>Assistant\n"
  text = tok.apply_chat_template(HISTORY[:1], add_generation_prompt=True, tokenize=False,
                                 attributes={"verbosity": 3})
  assert text == "<s>" + template.generation_prompt(conv, {"verbosity": 3})


def test_the_template_does_not_rely_on_whitespace_settings():
  """Plain Jinja (no trim_blocks / lstrip_blocks) renders what transformers' environment does."""
  text = chat_template.chat_template(SPECS["helpsteer"])
  messages = [SYSTEM, *HISTORY]
  outputs = []
  for env in (jinja2.Environment(), jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True)):
    env.globals["raise_exception"] = lambda message: (_ for _ in ()).throw(ValueError(message))
    outputs.append(env.from_string(text).render(
        messages=messages, attributes={"verbosity": 1}, add_generation_prompt=True,
        bos_token="<s>"))
  assert outputs[0] == outputs[1] == "<s>" + template.generation_prompt(
      _conversation(messages), {**SPECS["helpsteer"].defaults, "verbosity": 1})


@pytest.mark.parametrize("messages,attributes,message", [
    (HISTORY, {"wit": 1}, "unknown attribute 'wit' in attributes"),
    (HISTORY, {"verbosity": 5}, "score of 'verbosity' in attributes is 5; use an integer 0..4"),
    (HISTORY, {"verbosity": -1}, "score of 'verbosity' in attributes is -1"),
    (HISTORY, {"verbosity": True}, "score of 'verbosity' in attributes is True"),
    (HISTORY, {"verbosity": "2"}, "score of 'verbosity' in attributes is 2"),
    (HISTORY, "verbosity:9", "score of 'verbosity' in attributes is 9"),
    (HISTORY, "verbosity=1", "malformed attributes verbosity=1"),
    (HISTORY, "verbosity:1,verbosity:2", "'verbosity' appears twice in attributes"),
    (HISTORY, ["verbosity"], "attributes must be an object"),
    ([dict(HISTORY[1], label="humour:1"), HISTORY[0]], None,
     "unknown attribute 'humour' in the label of a message"),
    ([HISTORY[0], {"role": "tool", "content": "x"}], None, "message role 'tool'"),
    ([HISTORY[0], SYSTEM], None, "message role 'system'"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], None,
     "content of a user message must be text"),
])
def test_bad_input_is_a_clear_error(base_export, tmp_path, messages, attributes, message):
  tok = transformers.AutoTokenizer.from_pretrained(
      _export(base_export, SPECS["helpsteer"], tmp_path))
  with pytest.raises(jinja2.TemplateError, match=message.replace("(", r"\(")):
    tok.apply_chat_template(messages, attributes=attributes, add_generation_prompt=True,
                            tokenize=False)


def test_template_and_section_survive_transformers_round_trips(base_export, tmp_path):
  spec = SPECS["subset"]
  export = _export(base_export, spec, tmp_path)
  # The turn marker joins generation_config's EOS ids only where it is one token.
  tok = transformers.AutoTokenizer.from_pretrained(export)
  marker = chat_template.turn_marker_id(tok)
  assert (marker is not None) == (tok.convert_tokens_to_ids(template.TURN_START)
                                  != tok.unk_token_id)
  if marker is not None:
    chat_template.export_files(spec, export, turn_marker=marker)
    chat_template.export_files(spec, export, turn_marker=marker)  # idempotent
    eos = json.loads((export / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [tok.eos_token_id, marker]
  jinja = (export / "chat_template.jinja").read_text()
  if (export / "tokenizer_config.json").is_file():  # older transformers read it from here
    assert json.loads((export / "tokenizer_config.json").read_text())["chat_template"] == jinja
  assert json.loads((export / "config.json").read_text())["steerlm"] == {
      "attributes": ["humor", "verbosity"], "defaults": {"humor": 1, "verbosity": 2}}
  assert chat_template.read_spec(export) == spec
  tok = transformers.AutoTokenizer.from_pretrained(export)
  tok.save_pretrained(tmp_path / "again")
  config = transformers.AutoConfig.from_pretrained(export)
  config.save_pretrained(tmp_path / "again")
  assert (tmp_path / "again" / "chat_template.jinja").read_text() == jinja
  assert chat_template.read_spec(tmp_path / "again") == spec


def test_steer_spec_checks_and_the_attributes_labels_carry(tmp_path):
  convs = [helpsteer.helpsteer_conversation(*helpsteer.helpsteer_fields(r))
           for r in demo_rows.demo_rows(8, seed=0)]
  assert chat_template.trained_attributes(convs) == SPECS["helpsteer"]
  assert chat_template.trained_attributes([Conversation("s", (Turn("User", "x"),))]) == (
      chat_template.NO_LABELS)
  with pytest.raises(ValueError, match="in that order"):
    chat_template.SteerSpec(("verbosity", "humor"), {"verbosity": 1, "humor": 1})
  with pytest.raises(ValueError, match="one score for each"):
    chat_template.SteerSpec(("humor",), {})
  with pytest.raises(ValueError, match="outside 0..4"):
    chat_template.SteerSpec(("humor",), {"humor": 9})
  (tmp_path / "config.json").write_text(json.dumps({"steerlm": {"attributes": ["wit"]}}))
  with pytest.raises(ConfigError, match="config.json: malformed 'steerlm' section"):
    chat_template.read_spec(tmp_path)
  (tmp_path / "config.json").write_text("{}")
  assert chat_template.read_spec(tmp_path) is None
  assert chat_template.read_spec(tmp_path / "missing") is None
  # A PEFT adapter's own file; the adapter_config.json section of earlier adapter exports.
  spec = chat_template.SteerSpec(("humor",), {"humor": 3})
  adapter = tmp_path / "adapter"
  adapter.mkdir()
  (adapter / "adapter_config.json").write_text(json.dumps({"steerlm": spec.section()}))
  assert chat_template.read_spec(adapter) == spec
  (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
  chat_template.export_files(spec, adapter)
  assert json.loads((adapter / "steerlm.json").read_text()) == spec.section()
  assert "steerlm" not in json.loads((adapter / "adapter_config.json").read_text())
  assert chat_template.read_spec(adapter) == spec


def _generate_config(**overrides):
  import runpy

  from conftest import REPO_ROOT
  config = runpy.run_path(str(REPO_ROOT / "configs" / "generate.py"))["get_config"]()
  config.update(overrides)
  return config


def test_generate_precedence_config_then_model_then_nemo():
  spec = SPECS["subset"]
  assert steering.run_attributes(_generate_config(), spec) == {"humor": 1, "verbosity": 2}
  config = _generate_config()
  config.steer.verbosity = 0
  assert steering.run_attributes(config, spec) == {"humor": 1, "verbosity": 0}
  config.steer_attributes = "helpsteer"  # explicit names win; values: config, model, NeMo
  assert steering.run_attributes(config, spec) == dict(
      helpfulness=4, correctness=4, coherence=4, complexity=4, verbosity=0)
  assert template.label_string(steering.run_attributes(_generate_config(), None)) == (
      template.label_string(chat_template.NEMO_DEFAULTS))
  # An export trained without labels declares none: its prompts carry an empty label, as
  # its training (RL from a label-less source) rendered them; unless names are asked for.
  assert steering.run_attributes(_generate_config(), chat_template.NO_LABELS) == {}
  config = _generate_config()
  config.steer_attributes = "humor"
  assert steering.run_attributes(config, chat_template.NO_LABELS) == {"humor": 0}


def test_the_server_and_a_local_judge_ask_an_export_for_its_own_attributes(tmp_path):
  """`run_attributes` of the export's section: what the server's chat route
  (`serve.backend.default_attributes`) and a local judge (`inference.judge`) both ask."""
  from helpsteer_jax import weights
  from helpsteer_jax.serve import backend
  (tmp_path / "config.json").write_text(json.dumps(
      {"steerlm": chat_template.NO_LABELS.section()}))
  config = _generate_config()
  config.init.source = str(tmp_path)
  assert weights.steer_spec(config) == chat_template.NO_LABELS
  assert backend.default_attributes(config) == {}
  (tmp_path / "config.json").write_text("{}")  # a model without the section: NeMo's nine
  assert backend.default_attributes(config) == dict(chat_template.NEMO_DEFAULTS)


def test_dpo2d_export_steers_the_response_label_else_the_policy_source(tmp_path):
  from helpsteer_jax.runs import preference
  config = ml_collections.ConfigDict({
      "data": {"response_label": "verbosity:2,helpfulness:3"},
      "init": {"source": "", "step": -1}})
  assert preference.steer_spec(config) == chat_template.SteerSpec(
      ("helpfulness", "verbosity"), {"helpfulness": 3, "verbosity": 2})
  config.data.response_label = ""
  assert preference.steer_spec(config) == chat_template.NO_LABELS
  run = tmp_path / "acsft"
  (run / "hf").mkdir(parents=True)
  (run / "hf" / "config.json").write_text(json.dumps({"steerlm": SPECS["subset"].section()}))
  config.init.source = str(run / "checkpoints")
  assert preference.steer_spec(config) == SPECS["subset"]
  config.init.update(source=str(run / "hf"))
  assert preference.steer_spec(config) == SPECS["subset"]
  config.data.response_label = "verbosity:7"
  with pytest.raises(ConfigError, match="data.response_label: .*outside 0..4"):
    preference.steer_spec(config)


def test_acsft_export_carries_the_template_and_generate_uses_it(tmp_path):
  """End to end: the demo AC-SFT run (HelpSteer's five attributes) exports its
  template and section; `generate` on the export asks for those five."""
  work = tmp_path / "acsft"
  run_main("--config=configs/acsft.py", f"--workdir={work}", *TINY_RUN,
           "--config.train.num_steps=2", "--config.train.save_every=2",
           "--config.data.demo_train_rows=32", "--config.data.demo_validation_rows=8")
  export = work / "hf"
  spec = chat_template.read_spec(export)
  assert spec == SPECS["helpsteer"]
  tok = transformers.AutoTokenizer.from_pretrained(export)
  got = tok.apply_chat_template(HISTORY, attributes={"verbosity": 0}, add_generation_prompt=True,
                                tokenize=False)
  assert got == "<s>" + template.generation_prompt(
      _conversation(HISTORY), {**spec.defaults, "verbosity": 0})
  # transformers' generate (and vLLM, which reads the same file) stops at the turn marker.
  marker = tok.convert_tokens_to_ids(template.TURN_START)
  eos = transformers.GenerationConfig.from_pretrained(export).eos_token_id
  assert eos == [tok.eos_token_id, marker]
  # The checkpoint's run and the HF directory both give the model's attributes.
  assert weights.steer_spec(_generate_config(init={"source": str(work)})) == spec
  prompts = tmp_path / "in.jsonl"
  prompts.write_text(json.dumps({"prompt": "Name two fruits."}) + "\n")
  run_main("--config=configs/generate.py", f"--workdir={tmp_path / 'gen'}",
           f"--config.init.source={export}", f"--config.input={prompts}",
           "--config.max_new_tokens=2", "--config.batch_size=1", "--config.steer.complexity=1")
  row = json.loads((tmp_path / "gen" / "generations.jsonl").read_text())
  assert row["attributes"] == {**spec.defaults, "complexity": 1}


def test_dpo2d_export_carries_the_template_of_its_response_label(tmp_path):
  from test_dpo2d_task import _config

  from helpsteer_jax.tasks import dpo2d
  config = _config(loss_type="dpo")
  config.train.export_hf = True
  config.data.response_label = "verbosity:1,helpfulness:4"
  dpo2d.run(config, str(tmp_path))
  export = tmp_path / "hf"
  spec = chat_template.read_spec(export)
  assert spec == chat_template.SteerSpec(("helpfulness", "verbosity"),
                                         {"helpfulness": 4, "verbosity": 1})
  tok = transformers.AutoTokenizer.from_pretrained(export)
  assert tok.apply_chat_template(HISTORY, add_generation_prompt=True, tokenize=False) == (
      "<s>" + template.generation_prompt(_conversation(HISTORY), spec.defaults))
