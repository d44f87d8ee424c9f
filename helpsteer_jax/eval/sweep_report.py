"""Steering-sweep reports: a Markdown table, a JSON file and a figure with a panel per
swept attribute (x = the requested value; y = mean words, and on a second axis mean
sentences and the attribute model's prediction of that attribute)."""

from __future__ import annotations

import json
import math
import pathlib

from helpsteer_jax.eval.steering_sweep import adherence, series

JSON_FILE, TABLE_FILE, PLOT_FILE = "sweep.json", "sweep.md", "sweep.png"
COMPARE_TABLE, COMPARE_PLOT = "adherence.md", "adherence.png"


def _fmt(x: float | None, digits: int = 1) -> str:
  return "-" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def table(summary: dict) -> str:
  """One Markdown row per setting; the last column is the prediction of the swept
  attribute (when the sweep had an attribute model)."""
  scored = any(e["predicted"] for entries in summary["sweeps"].values() for e in entries)
  header = ["attribute", "value", "mean words", "mean sentences", "mean tokens",
            "cut by length"] + (["predicted (that attribute)"] if scored else [])
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for name in summary["attributes"]:
    xs, predicted = series(summary, name, "predicted")
    for e, p in zip(summary["sweeps"][name], predicted):
      cells = [name, str(e["value"]), _fmt(e["mean_words"]), _fmt(e["mean_sentences"], 2),
               _fmt(e["mean_tokens"]), f"{100 * e['length_share']:.0f}%"]
      lines.append("| " + " | ".join(cells + ([_fmt(p, 2)] if scored else [])) + " |")
  return "\n".join(lines)


def _top(ys: list[float]) -> float:
  """An axis top with headroom above the largest value (1 when there is none)."""
  finite = [y for y in ys if not math.isnan(y)]
  return 1.15 * max(finite + [1.0 / 1.15])


def plot(summary: dict, path: str | pathlib.Path, title: str = "") -> list[str]:
  """Writes the figure (one panel per swept attribute, side by side); returns the
  attributes drawn, in panel order."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = list(summary["attributes"])
  fig, axes = plt.subplots(1, max(len(names), 1), figsize=(3.4 * max(len(names), 1), 3.2),
                           squeeze=False)
  for k, (ax, name) in enumerate(zip(axes[0], names)):
    xs, words = series(summary, name, "mean_words")
    _, sents = series(summary, name, "mean_sentences")
    _, predicted = series(summary, name, "predicted")
    lines = ax.plot(xs, words, "o-", color="C0", label="mean words")
    ax.set_ylim(0, _top(words))
    ax.set_xticks(xs)
    ax.set_xlabel(f"requested {name}")
    ax.set_title(name, fontsize=10)
    if k == 0:
      ax.set_ylabel("mean words")
    right = ax.twinx()
    lines += right.plot(xs, sents, "s--", color="C1", label="mean sentences")
    scored = not all(math.isnan(p) for p in predicted)
    if scored:
      lines += right.plot(xs, predicted, "^-", color="C2", label="predicted score")
      lines += right.plot(xs, xs, ":", color="0.6", label="requested")
    right.set_ylim(0, _top(sents + (predicted + xs if scored else [])))
    if k == len(names) - 1:
      right.set_ylabel("sentences / predicted score" if scored else "mean sentences")
    legend = lines
  if names:
    fig.legend(legend, [ln.get_label() for ln in legend], loc="lower center",
               ncol=len(legend), fontsize=8, frameon=False)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout(rect=(0, 0.07, 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return names


def write(summary: dict, out_dir: str | pathlib.Path, title: str = "") -> dict[str, str]:
  """`sweep.json`, `sweep.md` and `sweep.png` in `out_dir` (call on one process only)."""
  out = pathlib.Path(out_dir)
  paths = {"json": out / JSON_FILE, "table": out / TABLE_FILE, "plot": out / PLOT_FILE}
  paths["json"].write_text(json.dumps(summary, indent=2) + "\n")
  paths["table"].write_text((f"# {title}\n\n" if title else "") + table(summary) + "\n")
  plot(summary, paths["plot"], title)
  return {k: str(v) for k, v in paths.items()}


def read(path: str | pathlib.Path) -> dict:
  """A sweep summary `write` wrote."""
  return json.loads(pathlib.Path(path).read_text())


def comparison_table(summaries: dict[str, dict]) -> tuple[str, dict[str, dict]]:
  """(Markdown, the figures): per model, per swept attribute, the mean absolute error of
  the attribute model's predictions to the requested values, and their mean."""
  scores = {label: adherence(s) for label, s in summaries.items()}
  names = list(dict.fromkeys(n for s in summaries.values() for n in s["attributes"]))
  header = ["model"] + names + ["mean"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for label, row in scores.items():
    lines.append("| " + " | ".join([label] + [_fmt(row.get(n), 3) for n in names + ["mean"]])
                 + " |")
  return "\n".join(lines), scores


def plot_comparison(summaries: dict[str, dict], path: str | pathlib.Path, title: str = "") -> None:
  """One panel per swept attribute: each model's mean prediction of it against the
  requested value, and the identity (perfect adherence)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = list(dict.fromkeys(n for s in summaries.values() for n in s["attributes"]))
  fig, axes = plt.subplots(1, max(len(names), 1), figsize=(3.2 * max(len(names), 1), 3.2),
                           squeeze=False)
  for k, (ax, name) in enumerate(zip(axes[0], names)):
    for i, (label, summary) in enumerate(summaries.items()):
      if name in summary["sweeps"]:
        xs, ys = series(summary, name, "predicted")
        ax.plot(xs, ys, "o-", color=f"C{i}", label=label)
    ax.plot([0, 4], [0, 4], ":", color="0.6", label="requested")
    ax.set(xlim=(-0.2, 4.2), ylim=(-0.2, 4.2), xticks=range(5), title=name,
           xlabel=f"requested {name}")
    if k == 0:
      ax.set_ylabel("predicted (attribute model)")
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout(rect=(0, 0.08, 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write_comparison(summaries: dict[str, dict], out_dir: str | pathlib.Path,
                     title: str = "") -> dict:
  """`adherence.md` and `adherence.png` in `out_dir` (one process only); returns the
  table, the figures and the paths."""
  out = pathlib.Path(out_dir)
  text, scores = comparison_table(summaries)
  (out / COMPARE_TABLE).write_text((f"# {title}\n\n" if title else "") + text + "\n")
  if summaries:
    plot_comparison(summaries, out / COMPARE_PLOT, title)
  return {"table": text, "adherence": scores, "adherence_table": str(out / COMPARE_TABLE),
          "plot": str(out / COMPARE_PLOT) if summaries else None}
