"""The demo-figures script (benchmarks/demo_figures.py) without running a demo: the doc
tables it reads and writes, the drift it reports, its registry against the guides and the
configs, and a table built from hand-made run outputs."""

import json
import pathlib
import re
import sys

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # the scripts' `import common`
import common  # noqa: E402
import demo_figures  # noqa: E402
import demo_registry  # noqa: E402
import demo_rl  # noqa: E402
import demo_runs  # noqa: E402

DOC = """# A guide

Some prose.

<!-- demo-table -->
Measured on an AVX2 CPU on 2026-01-01; regenerate with the script.

| run | reward | KL | wall |
|---|---|---|---|
| a | 1.000 | 0.50 | 3 min 1 s |
| b | 2.000 | 0.25 | 2 min 0 s |
<!-- /demo-table -->

More prose.
"""


def _all_runs():
  for demo in demo_registry.DEMOS:
    for run in demo.runs:
      yield demo, run
  for run in demo_registry.PREREQUISITES.values():
    yield None, run


# ------------------------------------------------------------------- tables and drift

def test_a_marked_table_is_read_and_replaced_with_its_caption(tmp_path):
  doc = tmp_path / "guide.md"
  doc.write_text(DOC)
  caption, header, rows = common.read_doc_table("demo-table", doc)
  assert caption.startswith("Measured on an AVX2 CPU")
  assert demo_figures.caption_cpu(caption) == "AVX2"
  assert header == ["run", "reward", "KL", "wall"]
  assert rows == [["a", "1.000", "0.50", "3 min 1 s"], ["b", "2.000", "0.25", "2 min 0 s"]]
  assert common.read_doc_table("other", doc) is None
  common.update_doc_table("demo-table", ["run", "reward"], [["c", "3.\\1"]], doc,
                          caption="Measured on an AVX-512 (avx512f) CPU.")
  text = doc.read_text()
  assert text.startswith("# A guide\n\nSome prose.\n\n<!-- demo-table -->\n")
  assert text.endswith("<!-- /demo-table -->\n\nMore prose.\n")
  assert common.read_doc_table("demo-table", doc) == (
      "Measured on an AVX-512 (avx512f) CPU.", ["run", "reward"], [["c", "3.\\1"]])
  with pytest.raises(SystemExit, match="no <!-- missing --> section"):
    common.update_doc_table("missing", ["x"], [], doc)


def test_drift_names_each_changed_cell_and_row_but_not_wall_times(tmp_path):
  doc = tmp_path / "guide.md"
  doc.write_text(DOC)
  found = common.read_doc_table("demo-table", doc)
  header = ["run", "reward", "KL", "wall"]
  same = [["a", "1.000", "0.50", "9 min 9 s"], ["b", "2.000", " 0.25", "1 s"]]
  assert demo_figures.drift("t", header, same, ("wall",), found) == []
  assert demo_figures.drift("t", header, same, (), found) == [
      "t: row 'a', 'wall': doc '3 min 1 s', measured '9 min 9 s'",
      "t: row 'b', 'wall': doc '2 min 0 s', measured '1 s'"]
  changed = [["a", "1.001", "0.50", "-"], ["c", "2.000", "0.25", "-"]]
  assert demo_figures.drift("t", header, changed, ("wall",), found) == [
      "t: row 'b' is in the doc, not measured",
      "t: row 'a', 'reward': doc '1.000', measured '1.001'",
      "t: row 'c' measured, not in the doc: ['c', '2.000', '0.25', '-']"]
  # A column the doc lacks is a header drift; the others are still compared.
  lines = demo_figures.drift("t", ["run", "KL", "steps"], [["a", "0.40", "3"]], (), found)
  assert lines[0].startswith("t: header: doc ['run', 'reward', 'KL', 'wall'], measured")
  assert lines[1:] == ["t: row 'b' is in the doc, not measured",
                       "t: row 'a', 'KL': doc '0.50', measured '0.40'"]


def test_the_cpu_kind_names_the_avx512_flags():
  assert common.cpu_kind("flags\t\t: fpu sse avx2 avx512bw avx512f\nflags : avx512f\n") == (
      "AVX-512 (avx512bw, avx512f)")
  assert common.cpu_kind("flags\t\t: fpu sse avx avx2 fma\n") == "AVX2"


# ------------------------------------------------------------------- the registry

def test_every_demo_table_is_marked_in_its_guide_with_the_registry_columns():
  for demo in demo_registry.DEMOS:
    for table in demo.tables:
      found = common.read_doc_table(table.marker, REPO_ROOT / demo.doc)
      assert found is not None, f"{demo.doc} has no <!-- {table.marker} --> table"
      caption, header, rows = found
      assert header == list(table.header), (table.marker, header)
      assert rows and all(len(r) == len(header) for r in rows), table.marker
      assert f"--only {demo.name} --write-docs" in caption, table.marker
      assert set(table.timing) <= set(table.header)
    for image, (run, _) in demo.images.items():
      assert (REPO_ROOT / image).is_file() and run in {r.name for r in demo.runs}
  names = [d.name for d in demo_registry.DEMOS]
  markers = [t.marker for d in demo_registry.DEMOS for t in d.tables]
  runs = [r.name for _, r in _all_runs()]
  assert len(set(names)) == len(names) and len(set(markers)) == len(markers)
  assert len(set(runs)) == len(runs)


def test_every_rl_algorithm_has_a_demo_row():
  from helpsteer_jax.rl.algorithms import REGISTRY
  demos = demo_registry.demos_by_name()
  used = {}
  for name in ("rl-algorithms", "rl-distill"):
    for run in demos[name].runs + (demo_registry.PREREQUISITES["rl"],):
      used.setdefault(name, set()).add(demo_runs.parse_cli(run.commands[-1]).config.algorithm)
  assert used["rl-algorithms"] == set(REGISTRY) - {"distill"}
  assert "distill" in used["rl-distill"]


def _guide_text(path: pathlib.Path) -> str:
  """The guide with its shell continuations joined and its spaces collapsed."""
  return " ".join(path.read_text().replace("\\\n", "").split())


def test_every_command_is_its_guides_and_starts_as_main_would_start_it():
  """Each command appears in its guide (prerequisites: in a guide of a demo that uses
  them), parses with its overrides applied and passes main.py's checks (preset, renamed
  and unread keys), never writes into a linked prerequisite, and reads only what its
  fresh directory holds: a linked prerequisite or an earlier command's output."""
  guides = {d.doc: _guide_text(REPO_ROOT / d.doc) for d in demo_registry.DEMOS}
  for demo, run in _all_runs():
    docs = ([demo.doc] if demo else
            [d.doc for d in demo_registry.DEMOS if run.name in d.prerequisites()])
    for line in run.lines():
      assert any(" ".join(line.split()) in guides[d] for d in docs), (run.name, line)
    written = {f"workdir/{need}" for need in run.needs}
    for command in run.commands:
      parsed = demo_runs.parse_cli(command, {var: "/models/x" for var in run.exports})
      if parsed is None:
        written |= {w for w in demo_runs.split_command(command)[1] if w.startswith("workdir/")}
        continue
      assert parsed.workdir not in {f"workdir/{n}" for n in run.needs}, (run.name, command)
      written.add(parsed.workdir)  # its own (resumed)
      for value in _strings(parsed.config):
        if value.startswith("workdir/"):
          read = "/".join(value.split("/")[:2])
          assert read in written, f"{run.name}: {command} reads {value}; nothing writes it"
  assert demo_runs.parse_cli("head -n 2 a > b") is None


def _strings(config):
  for value in config.values():
    if hasattr(value, "values"):
      yield from _strings(value)
    elif isinstance(value, str):
      yield value


def test_a_bad_command_is_refused_as_main_refuses_it():
  from absl import flags

  from helpsteer_jax.errors import ConfigError
  with pytest.raises(ConfigError, match="read only when algorithm is gspo"):
    demo_runs.parse_cli("helpsteer-jax --config=configs/rl.py --config.loss.importance_level=seq"
                        "uence_token")
  with pytest.raises((flags.Error, AttributeError)):  # main.py names the key's neighbours
    demo_runs.parse_cli("helpsteer-jax --config=configs/rl.py --config.loss.no_such_key=1")
  parsed = demo_runs.parse_cli("helpsteer-jax --config=rl --config.algorithm=dapo")
  assert parsed.workdir == "workdir/rl_dapo" and parsed.config.algorithm == "dapo"
  env, argv = demo_runs.split_command("XLA_FLAGS=--a=1 helpsteer-jax --config=x 'a b'")
  assert env == {"XLA_FLAGS": "--a=1"} and argv == ["helpsteer-jax", "--config=x", "a b"]


# ------------------------------------------------------------------- extraction, end to end

def _fake_iterative_dpo(root: pathlib.Path) -> None:
  """An iterative-DPO run's files as the task writes them, and its prerequisite's record."""
  record = {"machine": {"cpu_kind": "AVX2", "date": "2026-01-02"}, "commit": "abc",
            "steps": [{"command": "c", "status": 0, "wall_s": 61.0, "peak_rss_gb": 1.25}],
            "wall_s": 61.0}
  for run_dir in (root / "prerequisites" / "acsft", root / "iterative-dpo" / "iterative_dpo"):
    run_dir.mkdir(parents=True)
    (run_dir / demo_runs.STEPS).write_text(json.dumps(record))
  workdir = root / "iterative-dpo" / "iterative_dpo" / "workdir" / "iterative_dpo"
  rewards = {"0": 1.25, "1": 3.0}
  means = {r: {a: 0.5 * i + k for k, a in enumerate(demo_registry.ATTRIBUTES)}
           for i, r in enumerate(rewards)}
  for i, r in enumerate(rewards):
    rdir = workdir / f"iteration_{r}"
    rdir.mkdir(parents=True)
    answers = [{"response": text} for text in ("x", "y", "x")[:2 + i]]
    (rdir / "eval.json").write_text(json.dumps({"reward": rewards[r], "answers": answers}))
    if r != "0":
      (rdir / "pairs.jsonl").write_text('{"p": 1}\n' * 7)
  (workdir / "summary.json").write_text(json.dumps({"eval_reward": rewards,
                                                    "eval_attributes": means}))


def test_reuse_builds_the_table_writes_it_and_then_finds_no_drift(tmp_path, monkeypatch,
                                                                   capsys):
  (tmp_path / "docs" / "tasks").mkdir(parents=True)
  guide = tmp_path / "docs" / "tasks" / "iterative_dpo.md"
  guide.write_text((REPO_ROOT / "docs" / "tasks" / "iterative_dpo.md").read_text())
  monkeypatch.setattr(common, "REPO", tmp_path)
  monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
  root = tmp_path / "runs"
  _fake_iterative_dpo(root)
  argv = ["--only", "iterative-dpo", "--reuse", str(root)]
  assert demo_figures.main(argv) == 1  # the guide's own figures differ
  assert "row '0 (AC-SFT)', 'greedy reward': doc '1.364', measured '1.250'" in (
      capsys.readouterr().out)
  assert demo_figures.main(argv + ["--write-docs"]) == 0
  caption, header, rows = common.read_doc_table("iterative-dpo", guide)
  assert rows == [["0 (AC-SFT)", "1.250", "0.00", "1.00", "2.00", "3.00", "4.00", "-",
                   "2 (the most common 1 times)"],
                  ["1", "3.000", "0.50", "1.50", "2.50", "3.50", "4.50", "7",
                   "2 (the most common 2 times)"]]
  assert re.match(r"Measured on an AVX2 CPU on 2026-01-02 \(1 min 1 s of runs, peak RSS 1\.2"
                  r" GB\); `python benchmarks/demo_figures.py --only iterative-dpo"
                  r" --write-docs` regenerates it\.$", caption), caption
  result = json.loads((tmp_path / "results" / "demo_figures.json").read_text())
  assert result["demos"]["iterative-dpo"]["tables"]["iterative-dpo"]["rows"] == rows
  capsys.readouterr()
  assert demo_figures.main(argv) == 0
  assert "iterative-dpo: matches the docs" in capsys.readouterr().out


def test_dynamic_sampling_and_clipping_are_read_from_the_metrics(tmp_path):
  workdir = tmp_path / "dapo" / "workdir" / "rl_dapo"
  workdir.mkdir(parents=True)
  records = [{"step": 0, "eval_reward": 2.0}]
  for i, (rounds, drop, filled) in enumerate([(1, 0.44, 0), (10, 0.94, 12), (3, 0.67, 9)]):
    records.append({"step": i + 1, "reward": 1.0, "dynamic_rounds": rounds,
                    "dynamic_drop_rate": drop, "dynamic_filled": filled,
                    "clip_fraction": 0.01 * i, "iteration_s": 2.0 + i})
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  (workdir / "summary.json").write_text("{}")
  run = demo_runs.Run("dapo", ("helpsteer-jax --config=configs/rl.py --config.algorithm=dapo",))
  r = demo_rl.RLRun(demo_runs.Outputs({"dapo": tmp_path / "dapo"}, {"dapo": run}), "dapo")
  assert r.dynamic_sampling() == (
      "14 extra rollout rounds (1-10 per iteration); groups dropped: 44% in iteration 1,"
      " 67-94% later; 21 dropped groups kept to fill batches")
  assert r.clip() == "clip fraction up to 0.020"
  assert r.seconds_per_iteration() == "3.0"
