"""Install sizes: the core and each extra, in fresh virtual environments.

python benchmarks/install_sizes.py [--pythons 3.11,3.12] [--targets core,tpu,...]

For each Python and target it makes a new venv, runs `pip install
'<tree>[extra]'` from a copy of this checkout (a wheel build, as users
install it), and records the bytes of the files in site-packages, the
number of distributions and the time taken (downloads included: pip's cache
is warm after the first target). An extra's "adds" is its size less the
core's on the same Python. Results accumulate in
benchmarks/results/install_sizes.json (a rerun skips finished targets) and
go to the table in docs/install.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "install_sizes.json"
TARGETS = ("core", "tpu", "cuda12", "cuda13", "aot", "tfds", "hub", "serve", "eval", "real",
           "test")


def find_python(version: str) -> str:
  """`pythonX.Y` on PATH, else pyenv's."""
  exe = shutil.which(f"python{version}")
  if exe and subprocess.run([exe, "-V"], capture_output=True).returncode == 0:
    return exe
  prefix = subprocess.run(["pyenv", "prefix", version], capture_output=True, text=True)
  if prefix.returncode == 0:
    return str(pathlib.Path(prefix.stdout.strip()) / "bin" / f"python{version}")
  raise SystemExit(f"no Python {version} (python{version} or pyenv's)")


def tree_bytes(path: pathlib.Path) -> int:
  return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def measure(python: str, source: pathlib.Path, target: str) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    env_dir = pathlib.Path(tmp) / "venv"
    subprocess.run([python, "-m", "venv", str(env_dir)], check=True)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip"]
    site = next((env_dir / "lib").glob("python*/site-packages"))
    before = tree_bytes(site)  # pip and setuptools of the bare venv
    spec = str(source) if target == "core" else f"{source}[{target}]"
    start = time.time()
    proc = subprocess.run([*pip, "install", "-q", spec], capture_output=True, text=True)
    seconds = time.time() - start
    if proc.returncode != 0:
      return {"error": proc.stderr.strip().splitlines()[-1:], "seconds": round(seconds, 1)}
    listed = subprocess.run([*pip, "list", "--format=json"], capture_output=True, text=True,
                            check=True).stdout
    dists = {d["name"].lower(): d["version"] for d in json.loads(listed)}
    return {"bytes": tree_bytes(site) - before, "distributions": len(dists),
            "seconds": round(seconds, 1),
            "versions": {k: dists[k] for k in ("jax", "jaxlib", "flax", "libtpu", "torch")
                         if k in dists}}


def load() -> dict:
  return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"pythons": {}}


def table_rows(results: dict) -> list[list[str]]:
  rows = []
  for version, targets in sorted(results["pythons"].items()):
    core = targets.get("core", {}).get("bytes")
    for target in TARGETS:
      r = targets.get(target)
      if not r:
        continue
      if "error" in r:
        rows.append([version, target, "failed", "", "", " ".join(r["error"])])
        continue
      adds = "" if target == "core" or core is None else f"+{(r['bytes'] - core) / 1e6:,.0f}"
      rows.append([version, target, f"{r['bytes'] / 1e6:,.0f}", adds, str(r["distributions"]),
                   ", ".join(f"{k} {v}" for k, v in r["versions"].items())])
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pythons", default="3.11,3.12")
  parser.add_argument("--targets", default=",".join(TARGETS))
  parser.add_argument("--render-only", action="store_true",
                      help="only rewrite the table in docs/install.md")
  args = parser.parse_args()
  results = load()
  if args.render_only:
    return render(results)
  with tempfile.TemporaryDirectory() as tmp:
    source = pathlib.Path(tmp) / "src"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "workdir", ".tpu_logs", "build", "*.egg-info", "__pycache__", "tests",
        "benchmarks", "docs"))
    for version in args.pythons.split(","):
      python = find_python(version)
      done = results["pythons"].setdefault(version, {})
      for target in args.targets.split(","):
        if target in done and "error" not in done[target]:
          continue
        done[target] = measure(python, source, target)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        print(version, target, done[target], flush=True)
  results["date"] = time.strftime("%Y-%m-%d")
  RESULTS.write_text(json.dumps(results, indent=2) + "\n")
  render(results)


def render(results: dict) -> None:
  sys.path.insert(0, str(REPO / "benchmarks"))
  import common
  common.update_doc_table(
      "install-sizes", ["Python", "target", "site-packages MB", "adds to the core MB",
                        "distributions", "versions"], table_rows(results),
      doc=common.INSTALL_DOC)


if __name__ == "__main__":
  main()
