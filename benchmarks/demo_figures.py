"""Regenerates the guides' demo tables by rerunning their commands, and flags drift.

  python benchmarks/demo_figures.py --list                  # the demos, their minutes
  python benchmarks/demo_figures.py --only iterative-dpo    # run, compare with the doc
  python benchmarks/demo_figures.py --reuse workdir/demo_figures --write-docs

Each demo (`demo_registry.DEMOS`) runs its guide's commands in fresh directories under
`--out` (the prerequisite runs, such as the default AC-SFT run, once, linked into each);
its tables' rows come from what the runs wrote. By default (`--check`) every table is
compared with its guide's marked table and each drifted cell is printed (doc value,
measured value; wall-time columns are not compared); the exit status is 1 on drift or a
failed run. `--write-docs` writes the tables, each with a caption naming the CPU kind
it was measured on and the command that regenerates it, and
benchmarks/results/demo_figures.json. `--reuse DIR` reads the runs of an earlier
invocation's `--out` instead of running anything.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys

import common
import demo_registry
import demo_runs
from demo_runs import Demo, Outputs, duration

DEFAULT_OUT = common.REPO / "workdir" / "demo_figures"
FIGURES = "figures.json"  # what an invocation measured, in its --out


def caption(demo: Demo, result: dict) -> str:
  return (f"Measured on an {result['cpu_kind']} CPU on {result['date']}"
          f" ({duration(result['wall_s'])} of runs, peak RSS {result['peak_rss_gb']:.1f} GB);"
          f" `python benchmarks/demo_figures.py --only {demo.name} --write-docs` regenerates"
          " it.")


def caption_cpu(text: str) -> str | None:
  found = re.search(r"Measured on an? (.+?) CPU", text)
  return found.group(1) if found else None


def drift(marker: str, header: list[str], rows: list[list[str]], timing: tuple[str, ...],
          doc: tuple[str, list[str], list[list[str]]]) -> list[str]:
  """Each difference between the measured table and the doc's: the header, rows only one
  side has, and every cell of a compared column (matched by name) that differs."""
  _, doc_header, doc_rows = doc
  out = []
  if doc_header != header:
    out.append(f"{marker}: header: doc {doc_header}, measured {header}")
  columns = []
  for j, name in enumerate(header):
    nth = header[:j].count(name)
    where = [k for k, h in enumerate(doc_header) if h == name]
    if name not in timing and j and nth < len(where):
      columns.append((j, where[nth], name))
  documented = {r[0]: r for r in doc_rows if r}
  measured = {r[0]: r for r in rows}
  for label in documented.keys() - measured.keys():
    out.append(f"{marker}: row {label!r} is in the doc, not measured")
  for label, row in measured.items():
    if label not in documented:
      out.append(f"{marker}: row {label!r} measured, not in the doc: {row}")
      continue
    for j, k, name in columns:
      want = " ".join(documented[label][k].split()) if k < len(documented[label]) else ""
      got = " ".join(row[j].split())
      if want != got:
        out.append(f"{marker}: row {label!r}, {name!r}: doc {want!r}, measured {got!r}")
  return out


def _stamp() -> dict:
  describe = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=common.REPO,
                            capture_output=True, text=True).stdout.strip()
  return {"machine": common.machine(), "commit": describe}


def _missing(demo: Demo, data: pathlib.Path) -> str | None:
  for run in demo.runs:
    reason = run.requires()
    if reason:
      return f"{run.name}: {reason}"
    for path, source in run.inputs.items():
      if not (data / source).exists():
        return f"{run.name} needs {data / source} (as {path}; --data names the directory)"
  return None


def _closure(names) -> list[str]:
  """The prerequisite runs `names` need, each after its own."""
  order: list[str] = []

  def visit(name: str) -> None:
    for need in demo_registry.PREREQUISITES[name].needs:
      visit(need)
    if name not in order:
      order.append(name)
  for name in names:
    visit(name)
  return order


def _prerequisite_dir(root: pathlib.Path, name: str) -> pathlib.Path:
  return root / "prerequisites" / name


def run_demos(demos: list[Demo], root: pathlib.Path, data: pathlib.Path) -> dict[str, str]:
  """Runs every demo's prerequisites once, then its runs; {demo: why it has no figures}."""
  failed: dict[str, str] = {}
  stamp = _stamp()
  ready: dict[str, pathlib.Path] = {}
  broken: dict[str, str] = {}
  for name in _closure(n for d in demos for n in d.prerequisites()):
    run = demo_registry.PREREQUISITES[name]
    if any(n in broken for n in run.needs):
      broken[name] = broken[next(n for n in run.needs if n in broken)]
      continue
    record = demo_runs.execute(run, _prerequisite_dir(root, name), root, data, ready, stamp)
    if "error" in record:
      broken[name] = record["error"]
    else:
      ready[name] = _prerequisite_dir(root, name)
  for demo in demos:
    bad = [broken[n] for n in _closure(demo.prerequisites()) if n in broken]
    if bad:
      failed[demo.name] = f"a prerequisite failed: {bad[0]}"
      continue
    for run in demo.runs:
      record = demo_runs.execute(run, root / demo.name / run.name, root, data, ready, stamp)
      if "error" in record:
        failed[demo.name] = record["error"]
        break
  return failed


def outputs(demo: Demo, root: pathlib.Path) -> Outputs:
  prerequisites = _closure(demo.prerequisites())
  dirs = {n: _prerequisite_dir(root, n) for n in prerequisites}
  dirs.update({r.name: root / demo.name / r.name for r in demo.runs})
  runs = {n: demo_registry.PREREQUISITES[n] for n in prerequisites}
  runs.update({r.name: r for r in demo.runs})
  return Outputs(dirs, runs)


def measure(demo: Demo, root: pathlib.Path) -> dict:
  """The demo's tables from its runs in `root`, with their machine and wall times."""
  out = outputs(demo, root)
  records = {n: out.record(n) for n in out.dirs}
  machine = records[demo.runs[0].name]["machine"]
  return {"doc": demo.doc, "cpu_kind": machine["cpu_kind"], "date": machine["date"],
          "commit": records[demo.runs[0].name]["commit"], "machine": machine,
          "wall_s": round(sum(records[r.name]["wall_s"] for r in demo.runs), 1),
          "peak_rss_gb": max(s["peak_rss_gb"] for r in demo.runs for s in records[r.name]["steps"]),
          "runs": {n: {"wall_s": r["wall_s"], "steps": r["steps"]} for n, r in records.items()},
          "tables": {t.marker: {"header": list(t.header), "rows": t.rows(out)}
                     for t in demo.tables}}


def write_docs(demo: Demo, result: dict, root: pathlib.Path) -> None:
  doc = common.REPO / demo.doc
  text = caption(demo, result)
  for table in demo.tables:
    figures = result["tables"][table.marker]
    common.update_doc_table(table.marker, figures["header"], figures["rows"], doc, text)
  out = outputs(demo, root)
  for target, (run, path) in demo.images.items():
    shutil.copyfile(out.dirs[run] / path, common.REPO / target)
  print(f"wrote {demo.doc}: {', '.join(t.marker for t in demo.tables)}")


def check(demo: Demo, result: dict) -> list[str]:
  """The drift of the demo's tables against its guide, with a note where the guide's
  figures come from another kind of CPU."""
  doc = common.REPO / demo.doc
  lines = []
  for table in demo.tables:
    found = common.read_doc_table(table.marker, doc)
    if found is None:
      lines.append(f"{table.marker}: {demo.doc} has no <!-- {table.marker} --> table")
      continue
    figures = result["tables"][table.marker]
    lines += drift(table.marker, figures["header"], figures["rows"], table.timing, found)
    cpu = caption_cpu(found[0])
    if lines and cpu and cpu != result["cpu_kind"]:
      lines.append(f"{table.marker}: (the doc's figures were measured on {cpu}, these on"
                   f" {result['cpu_kind']}: XLA:CPU's float reductions differ between them)")
  return lines


def list_demos(demos: list[Demo], data: pathlib.Path) -> None:
  total = 0.0
  for name in _closure(n for d in demos for n in d.prerequisites()):
    run = demo_registry.PREREQUISITES[name]
    total += run.minutes
    print(f"{'(prerequisite) ' + name:<34} {run.minutes:5.0f} min  {run.lines()[-1]}")
  for demo in demos:
    minutes = sum(r.minutes for r in demo.runs)
    total += minutes
    missing = _missing(demo, data)
    print(f"{demo.name:<34} {minutes:5.0f} min  {demo.doc}: "
          f"{', '.join(t.marker for t in demo.tables)}"
          + (f"  [skipped here: {missing}]" if missing else ""))
  print(f"{'in all':<34} {total:5.0f} min  (estimates on a 2-core CPU)")


def _select(only: str) -> list[Demo]:
  known = demo_registry.demos_by_name()
  names = [n.strip() for n in only.split(",") if n.strip()] if only else list(known)
  unknown = [n for n in names if n not in known]
  if unknown:
    sys.exit(f"--only: unknown demo {', '.join(unknown)}; choose from {', '.join(known)}")
  return [known[n] for n in names]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--only", default="", help="NAME[,NAME]: these demos (default: all)")
  parser.add_argument("--list", action="store_true", help="list the demos and their minutes")
  parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                      help="where the runs go (each run's directory is made fresh)")
  parser.add_argument("--reuse", type=pathlib.Path, default=None,
                      help="read the runs of an earlier --out instead of running")
  parser.add_argument("--data", type=pathlib.Path,
                      default=common.REPO / demo_registry.SHARED_DATA,
                      help="HelpSteer2's first 100 rows (helpsteer2/train_first100.jsonl) and"
                           " MT-Bench (mt_bench/question.jsonl), for the demos that read them")
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--check", action="store_true", help="compare with the docs (default)")
  mode.add_argument("--write-docs", action="store_true", help="rewrite the docs' tables")
  args = parser.parse_args(argv)
  demos = _select(args.only)
  if args.list:
    list_demos(demos, args.data)
    return 0
  root = (args.reuse or args.out).resolve()
  failed = {}
  for demo in demos:
    missing = (None if args.reuse else _missing(demo, args.data)) or (
        f"no runs in {root / demo.name}" if args.reuse and not (root / demo.name).is_dir()
        else None)
    if missing:
      failed[demo.name] = f"skipped: {missing}"
  if not args.reuse:
    failed.update(run_demos([d for d in demos if d.name not in failed], root, args.data))
  results = {}
  for demo in demos:
    if demo.name in failed:
      continue
    try:
      results[demo.name] = measure(demo, root)
    except (OSError, KeyError, ValueError) as e:
      failed[demo.name] = f"its outputs could not be read: {type(e).__name__}: {e}"
  previous = json.loads((root / FIGURES).read_text()) if (root / FIGURES).exists() else {}
  (root / FIGURES).write_text(json.dumps({**previous, **results}, indent=2) + "\n")
  drifted = 0
  for demo in demos:
    if demo.name in results and args.write_docs:
      write_docs(demo, results[demo.name], root)
    elif demo.name in results:
      lines = check(demo, results[demo.name])
      drifted += len(lines)
      print(f"{demo.name}: " + (f"{len(lines)} drifted" if lines else "matches the docs"))
      for line in lines:
        print("  " + line)
  if args.write_docs and results:
    path = common.RESULTS / "demo_figures.json"
    recorded = json.loads(path.read_text())["demos"] if path.exists() else {}
    common.write_result("demo_figures", {"demos": {**recorded, **results}})
  for name, why in failed.items():
    print(f"{name}: no figures ({why})")
  return 1 if failed or drifted else 0


if __name__ == "__main__":
  sys.exit(main())
