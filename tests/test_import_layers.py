"""The package's imports follow the layer order docs/architecture.md lists.

The layout tree in the architecture document is the reference: a module may
import only modules listed below it (or its own entry's modules, e.g. one
family module from another). Every import counts, including those inside
functions, so the document stays true as code moves.
"""

import ast
import pathlib
import re

from conftest import REPO_ROOT

PACKAGE = "helpsteer_jax"
_ENTRY = re.compile(r"^( *)([\w.]+(?:\.py|/)(?:, [\w.]+\.py)*)(?:\s|$)")


def layer_entries(doc: str) -> list[list[str]]:
  """The tree's entries in order, each a list of dotted module or package names."""
  block = doc.split(f"```\n{PACKAGE}/\n", 1)[1].split("```", 1)[0]
  entries, parents = [], []
  for line in block.splitlines():
    match = _ENTRY.match(line)
    if not match or len(match.group(1)) % 2:
      continue
    depth = len(match.group(1)) // 2 - 1
    if depth < 0:
      break  # configs/, benchmarks/, tests/: outside the package
    del parents[depth:]
    names = [n.strip() for n in match.group(2).split(",")]
    prefix = ".".join([PACKAGE, *parents])
    entries.append([f"{prefix}.{n.removesuffix('.py').removesuffix('/')}" for n in names])
    if names[0].endswith("/"):
      parents.append(names[0][:-1])
  return entries


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(REPO_ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
  path = REPO_ROOT.joinpath(*name.split("."))
  return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imported_modules(path: pathlib.Path) -> set[str]:
  """Package modules `path` imports (`from pkg import mod` names the module)."""
  tree = ast.parse(path.read_text())
  package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent)
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([base] if base else []))
      for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.add(sub if _is_module(sub) else base)
  return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def _rank(module: str, ranks: dict[str, int]) -> int | None:
  """The rank of the most specific listed entry holding `module`."""
  parts = module.split(".")
  for end in range(len(parts), 1, -1):
    if ".".join(parts[:end]) in ranks:
      return ranks[".".join(parts[:end])]
  return None


def test_every_module_is_listed_and_imports_point_down():
  entries = layer_entries((REPO_ROOT / "docs" / "architecture.md").read_text())
  ranks = {name: i for i, names in enumerate(entries) for name in names}
  assert len(ranks) > 40, "the layout tree was not found"
  for name in ranks:
    assert _is_module(name), f"docs/architecture.md lists {name}, which does not exist"
  upward, unlisted = [], []
  for path in sorted((REPO_ROOT / PACKAGE).rglob("*.py")):
    module = _module_name(path)
    if module == PACKAGE:
      continue
    mine = _rank(module, ranks)
    if mine is None:
      unlisted.append(module)
      continue
    for target in sorted(imported_modules(path)):
      theirs = _rank(target, ranks)
      if theirs is None:
        unlisted.append(target)
      elif theirs < mine and not module.startswith(target + "."):
        upward.append(f"{module} imports {target}, listed above it")
  assert not unlisted, f"not in docs/architecture.md's tree: {sorted(set(unlisted))}"
  assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_layer_parser_reads_nesting_and_shared_lines():
  doc = ("x\n```\nhelpsteer_jax/\n  main.py   entry\n  models/\n    hf.py, rope.py\n"
         "                     wrapped description\n  errors.py  e\nconfigs/  c\n```\n")
  assert layer_entries(doc) == [["helpsteer_jax.main"], ["helpsteer_jax.models"],
                                ["helpsteer_jax.models.hf", "helpsteer_jax.models.rope"],
                                ["helpsteer_jax.errors"]]


def test_every_primary_process_check_goes_through_one_function():
  """`processes.is_primary()` is the package's one test of "is this process 0"."""
  direct = []
  for path in sorted((REPO_ROOT / PACKAGE).rglob("*.py")):
    if path.name == "processes.py":
      continue
    text = path.read_text()
    for pattern in ("process_index() == 0", "process_index() != 0", "process_index() > 0"):
      if pattern in text:
        direct.append(f"{path.relative_to(REPO_ROOT)}: {pattern}")
  assert not direct, "use processes.is_primary():\n" + "\n".join(direct)


def reached(start: str) -> set[str]:
  """Package modules loaded by importing `start`: every import followed (in functions too),
  with the `__init__` of every package on the way."""
  def path_of(name: str) -> pathlib.Path:
    path = REPO_ROOT.joinpath(*name.split("."))
    return path / "__init__.py" if (path / "__init__.py").exists() else path.with_suffix(".py")

  def with_parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}

  seen, todo = set(), with_parents(start)
  while todo:
    module = todo.pop()
    if module in seen or not path_of(module).exists():
      continue
    seen.add(module)
    for target in imported_modules(path_of(module)):
      todo |= with_parents(target) - seen
  return seen


# What a training task loads; lower it as modules lose imports they do not need.
MAX_TRAINING_TASK_MODULES = {"acsft": 70, "attribute_model": 83, "dpo2d": 79}


def test_training_tasks_load_no_evaluation_serving_or_remote_scoring():
  for task, most in MAX_TRAINING_TASK_MODULES.items():
    modules = reached(f"{PACKAGE}.tasks.{task}")
    banned = sorted(m for m in modules if m.startswith((f"{PACKAGE}.eval", f"{PACKAGE}.serve"))
                    or m in (f"{PACKAGE}.scoring.remote", f"{PACKAGE}.scoring.load"))
    assert not banned, f"tasks.{task} loads {banned}"
    assert len(modules) <= most, (task, len(modules), sorted(modules))
  assert f"{PACKAGE}.eval.mt_bench_report" in reached(f"{PACKAGE}.tasks.evaluate_generation")


def test_no_task_entry_imports_another():
  """tasks/ holds entry points only: what two tasks share lives in runs/ (or lower)."""
  entries = {f"{PACKAGE}.tasks.{p.stem}" for p in (REPO_ROOT / PACKAGE / "tasks").glob("*.py")
             if p.stem != "__init__"}
  sideways = {}
  for module in sorted(entries):
    path = REPO_ROOT.joinpath(*module.split(".")).with_suffix(".py")
    found = sorted(imported_modules(path) & (entries | {f"{PACKAGE}.tasks"}))
    if found:
      sideways[module] = found
  assert not sideways, sideways
  assert len(entries) == len(__import__(f"{PACKAGE}.tasks", fromlist=["TASKS"]).TASKS)


def test_task_configs_import_only_the_config_layer():
  allowed = {f"{PACKAGE}.config_base", f"{PACKAGE}.config_sections"}
  for path in sorted((REPO_ROOT / PACKAGE / "configs").glob("*.py")):
    if path.name != "__init__.py":
      assert imported_modules(path) <= allowed, (path.name, imported_modules(path) - allowed)


def test_loading_every_config_and_help_load_no_jax():
  """`--help` loads all the task configs: none of them may load JAX (seconds of imports)."""
  import subprocess
  import sys
  code = ("import sys\n"
          "from helpsteer_jax import task_configs\n"
          "tasks = task_configs.packaged_tasks()\n"
          "text = task_configs.help_text('helpsteer-jax')\n"
          "print(len(tasks), 'acsft' in text, sorted(m for m in ('jax', 'flax', 'grain', 'optax',"
          " 'transformers') if m in sys.modules))\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                       text=True, check=True).stdout.split()
  shipped = len([p for p in (REPO_ROOT / PACKAGE / "configs").glob("*.py")
                 if p.name != "__init__.py"])
  assert out == [str(shipped), "True", "[]"], out


def test_registries_import_only_the_entries_asked_for():
  """The model families and the RL algorithms load when first asked for (registry.py)."""
  import subprocess
  import sys
  code = ("import sys\n"
          "from helpsteer_jax.models import families\n"
          "from helpsteer_jax.rl import algorithms\n"
          "assert sorted(families.FAMILIES) == ['gemma2', 'llama', 'mistral', 'qwen2', 'qwen3']\n"
          "assert families.get('llama').model_type == 'llama'\n"
          "assert algorithms.REGISTRY['grpo'].name == 'grpo'\n"
          "prefixes = ('helpsteer_jax.models.families.', 'helpsteer_jax.rl.algorithms.')\n"
          "loaded = sorted(m for m in sys.modules if m.startswith(prefixes))\n"
          "print(loaded)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO_ROOT, check=True).stdout
  assert eval(out) == ["helpsteer_jax.models.families.base", "helpsteer_jax.models.families.llama",
                       "helpsteer_jax.rl.algorithms.base", "helpsteer_jax.rl.algorithms.grpo"]
  from helpsteer_jax.models import families
  for name, family in families.FAMILIES.items():
    assert family.model_type == name  # each entry's module holds its own family
