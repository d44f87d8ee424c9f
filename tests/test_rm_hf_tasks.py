"""The tasks with the attribute model's HF export: written at the end of training, converted
from an Orbax checkpoint (export_rm), and read by evaluate_rm (CLI), annotate and the
attribute scorer in place of the Orbax checkpoint. Tiny model, a few steps."""

import json

import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file
from torch_reference import needs_torch, torch

from helpsteer_jax import runtime
from helpsteer_jax.data.features import regression_ids as rid
from helpsteer_jax.data.formats import helpsteer as readers
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.load import reward as reward_model
from helpsteer_jax.models import hf
from helpsteer_jax.scoring.load import load_scorer
from helpsteer_jax.scoring.model import ModelScorer
from helpsteer_jax.tasks import annotate, attribute_model, evaluate_rm, export_rm

from cli_utils import run_main
from task_configs import TINY_SHAPE, short_config

SHAPE = TINY_SHAPE


def config(task, **sections):
  return short_config(task, export=True, **sections)


@pytest.fixture(scope="module")
def trained(attribute_model_run):
  """The session's attribute-model run (regression, bias-free head) with its
  end-of-training export."""
  return attribute_model_run


def _tensors(directory):
  out = {}
  for f in sorted(directory.glob("*.safetensors")):
    out.update(load_file(f))
  return out


@needs_torch
def test_training_exports_a_transformers_reward_model(trained):
  """The end-of-training export loads in transformers' AutoModelForSequenceClassification
  (reference) with the nine attribute labels and the tokenizer's pad id, and its scores
  of demo conversations equal the Orbax checkpoint's through our scorer (1e-4, fp32)."""
  out = trained / "hf"
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, dtype=torch.float32).eval()
  tokenizer = hf.load_tokenizer(out)
  assert model.config.pad_token_id == tokenizer.pad_token_id
  assert model.config.num_labels == 9

  cfg = config("evaluate_rm", scorer={"source": str(trained)})
  cfg.scorer.tokenizer = str(trained / "demo_tokenizer")
  rt = runtime.setup(cfg)
  scorer = load_scorer(cfg.scorer, rt)
  tok = rid.RegressionTokenizer(tokenizer, 128)
  convs = readers.read_records(trained / "demo_data", "validation")[:8]
  ids = [tok.ids(c) for c in convs]
  ours = scorer.score_ids(ids)
  np.testing.assert_array_equal(scorer(convs), ours)  # conversations tokenized alike
  width = max(map(len, ids))
  padded = np.full((len(ids), width), tokenizer.pad_token_id)
  mask = np.zeros((len(ids), width), np.int64)
  for i, row in enumerate(ids):
    padded[i, :len(row)], mask[i, :len(row)] = row, 1
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(padded), attention_mask=torch.tensor(mask)).logits
  np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-4, rtol=0)
  assert np.abs(ours).max() > 1e-3


def test_export_rm_converts_the_checkpoint_to_the_training_export(trained, tmp_path):
  """The end-of-training export's config, read by transformers' AutoConfig, has the nine
  attribute labels and the tokenizer's pad id; export_rm converts the Orbax checkpoint to
  the export's tensors bit for bit (reference: that export)."""
  out = trained / "hf"
  hf_config = transformers.AutoConfig.from_pretrained(out)
  assert hf_config.pad_token_id == hf.load_tokenizer(out).pad_token_id
  assert hf_config.num_labels == 9
  conv = config("export_rm", init={"source": str(trained)})
  conv.tokenizer, conv.dtype = str(trained / "demo_tokenizer"), "float32"
  export_rm.run(conv, str(tmp_path / "export"))
  a, b = _tensors(out), _tensors(tmp_path / "export" / "hf")
  assert set(a) == set(b)
  for name in a:
    assert a[name].tobytes() == b[name].tobytes(), name


def test_evaluate_rm_cli_and_annotate_read_the_hf_directory(trained, tmp_path):
  """evaluate_rm from the HF directory (CLI, --config.scorer.source=<dir>/hf) reports the
  metrics of the Orbax checkpoint; annotate from it writes the same labels."""
  data = {"validation_path": str(trained / "demo_data"), "preference_path": ""}
  orbax = config("evaluate_rm", scorer={"source": str(trained)}, data=data)
  orbax.scorer.tokenizer = str(trained / "demo_tokenizer")
  want = evaluate_rm.run(orbax, str(tmp_path / "orbax"))

  run_main("--config=configs/evaluate_rm.py", f"--workdir={tmp_path / 'from_hf'}",
           f"--config.scorer.source={trained / 'hf'}", "--config.scorer.model.name=tiny",
           "--config.scorer.batch_size=8", "--config.scorer.max_len=128",
           f"--config.data.validation_path={trained / 'demo_data'}")
  got = json.loads((tmp_path / "from_hf" / "rm_report.json").read_text())
  assert set(got["attributes"]) == set(want["attributes"])
  for name, metrics in want["attributes"].items():
    for key in ("mse", "mae"):
      assert got["attributes"][name][key] == pytest.approx(metrics[key], abs=1e-5), (name, key)

  outs = {}
  for kind, source in (("orbax", str(trained)), ("hf", str(trained / "hf"))):
    outs[kind] = tmp_path / f"{kind}.jsonl"
    ann = config("annotate", scorer={"source": source},
                 data={"output_path": str(outs[kind]), "max_rows": 12, "chunk_rows": 8,
                       "input_path": str(trained / "demo_data")})
    if kind == "orbax":
      ann.scorer.tokenizer = str(trained / "demo_tokenizer")
    annotate.run(ann, str(tmp_path / f"annotate_{kind}"))
  assert outs["hf"].read_text() == outs["orbax"].read_text()


def test_best_of_n_scorer_reads_either_source(trained):
  """The attribute-model scorer (`load_scorer`, best-of-n's too) gives the same
  predictions from the HF directory as from the Orbax workdir."""
  cfg = config("evaluate_rm")
  rt = runtime.setup(cfg)
  convs = readers.read_records(trained / "demo_data", "validation")[:4]
  cfg.scorer.source = str(trained / "hf")
  from_hf = load_scorer(cfg.scorer, rt)
  cfg.scorer.source = str(trained)
  from_orbax = load_scorer(cfg.scorer, rt)
  assert isinstance(from_hf, ModelScorer) and isinstance(from_orbax, ModelScorer)
  np.testing.assert_allclose(from_hf(convs), from_orbax(convs), atol=1e-5, rtol=0)


def test_head_bias_needs_export_off(trained, tmp_path):
  """head_bias=True is refused before training while the HF export is on, naming both
  options; a bias-free checkpoint cannot continue as a biased head (no silent change)."""
  cfg = config("attribute_model")
  cfg.head_bias = True
  with pytest.raises(ConfigError, match="head_bias=False"):
    attribute_model.check_config(cfg)
  cfg.train.export_hf = False
  attribute_model.check_config(cfg)
  cfg.init.source = str(trained)
  with pytest.raises(ConfigError, match="head_bias=False"):
    reward_model.build_reward_model(cfg, runtime.setup(cfg))
