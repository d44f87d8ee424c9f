"""The reward-model benchmarks: RM-Bench, JudgeBench and RewardBench 2.

Each formula against a NumPy re-derivation of its authors' scoring code (RM-Bench's
`scripts/utils.py` compute_accuracy, JudgeBench's `utils/metrics.py` with the order
swapped, RewardBench 2's `reroll_and_score_dataset` and Ties `process_single_model`), on
hand-made rows whose rewards are set by hand (the fake scorer reads the number a response
starts with); the readers on files written in the released schemas; evaluate_rm end to
end on them.
"""

import gzip
import itertools
import json
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpsteer_jax.data.formats import benchmarks as readers
from helpsteer_jax.data.formats.preference import PreferencePair, with_response
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import DataError
from helpsteer_jax.scoring import benchmarks
from helpsteer_jax.scoring.scorer import HostScorer, context_groups, predict_groups
from helpsteer_jax.tasks import evaluate_rm

import fake_scorer
from task_configs import short_config

WEIGHTS = np.eye(len(ATTRIBUTES))[ATTRIBUTES.index("helpfulness")]  # the number itself


def numeric_scorer() -> HostScorer:
  return HostScorer(fake_scorer.make_numeric(None))


def _say(reward, text: str = "answer") -> str:
  return f"{reward} {text}"


def test_predict_groups_keeps_each_group_one_context_group_of_its_call():
  """Whole groups per call (up to `chunk` conversations, a larger group alone), a new call
  where two neighbours answer the same prompt; each group's rows come back in place."""
  sizes, prompts = (2, 2, 2, 6, 1, 2), ("p", "q", "q", "r", "s", "t")
  groups = [[with_response(p, f"{i + k} r", "x") for k in range(n)]
            for i, (n, p) in enumerate(zip(sizes, prompts))]
  calls = []

  def record(convs):
    calls.append([len(g) for g in context_groups(convs)])
    return fake_scorer.make_numeric(None)(convs)

  out = predict_groups(groups, HostScorer(record), chunk=5)
  assert calls == [[2, 2], [2], [6], [1, 2]]
  for i, (group, preds) in enumerate(zip(groups, out)):
    assert preds[:, ATTRIBUTES.index("helpfulness")].tolist() == [i + k for k in range(
        len(group))]


# ---------------------------------------------------------------- RM-Bench

RM_DOMAINS = ("chat", "code", "math", "safety-refuse", "safety-response", "chat", "code",
              "math", "safety-response", "chat")


def rm_bench_rows() -> list[dict]:
  """RM-Bench rows (total_dataset.json's schema) with integer rewards 0..3: many ties."""
  rng = np.random.default_rng(0)
  rows = []
  for i, domain in enumerate(RM_DOMAINS):
    chosen, rejected = rng.integers(0, 4, 3), rng.integers(0, 4, 3)
    rows.append({"id": i, "prompt": f"Question {i}?", "domain": domain,
                 "chosen": [_say(r, f"chosen {k}") for k, r in enumerate(chosen)],
                 "rejected": [_say(r, f"rejected {k}") for k, r in enumerate(rejected)]})
  return rows


def reference_rm_bench(rows: list[dict]) -> dict:
  """RM-Bench's compute_accuracy re-derived: per domain prefix the 3x3 count matrix of
  chosen_i > rejected_j over its rows, triangles and diagonal, then the means."""
  def accuracy(unit):
    acc = np.zeros((3, 3))
    for row in unit:
      for i in range(3):
        for j in range(3):
          acc[i][j] += row["score_chosen"][i] > row["score_rejected"][j]
    acc /= len(unit)
    return {"hard": np.sum(np.triu(acc, 1)) / 3, "normal": np.mean(np.diag(acc)),
            "easy": np.sum(np.tril(acc, -1)) / 3, "matrix": acc}

  scored = [{"domain": r["domain"],
             "score_chosen": [float(c.split()[0]) for c in r["chosen"]],
             "score_rejected": [float(c.split()[0]) for c in r["rejected"]]} for r in rows]
  per = {d: accuracy([r for r in scored if r["domain"].startswith(d)])
         for d in ("chat", "math", "code", "safety")}
  average = {d: np.mean([v["hard"], v["normal"], v["easy"]]) for d, v in per.items()}
  return {"per": per, "average": average, "overall": np.mean(list(average.values())),
          **{k: np.mean([v[k] for v in per.values()]) for k in ("hard", "normal", "easy")}}


def check_rm_bench(result: dict, rows: list[dict]):
  want = reference_rm_bench(rows)
  assert result["overall"] == pytest.approx(want["overall"], abs=1e-12)
  for k in ("hard", "normal", "easy"):
    assert result[k] == pytest.approx(want[k], abs=1e-12), k
  assert set(result["by_domain"]) == {"chat", "code", "math", "safety"}
  for d, m in result["by_domain"].items():
    np.testing.assert_allclose(m["matrix"], want["per"][d]["matrix"], atol=1e-12)
    assert m["average"] == pytest.approx(want["average"][d], abs=1e-12)
    assert m["hard"] == pytest.approx(want["per"][d]["hard"], abs=1e-12)


def test_rm_bench_matrix_domains_and_overall_match_rm_bench():
  rows = rm_bench_rows()
  records = [readers.rm_bench_row(r, f"x:{i}") for i, r in enumerate(rows)]
  assert [r.domain for r in records][3:5] == ["safety", "safety"]  # both safety kinds
  result = benchmarks.evaluate_rm_bench(numeric_scorer(), records, WEIGHTS)
  check_rm_bench(result, rows)
  assert result["count"] == len(rows) and result["dropped"] == 0
  assert result["by_domain"]["safety"]["count"] == 3
  # A tie is wrong: equal rewards everywhere give 0, not 1/2.
  tie = readers.rm_bench_row({**rows[0], "chosen": ["1"] * 3, "rejected": ["1"] * 3}, "x")
  flat = benchmarks.evaluate_rm_bench(numeric_scorer(), [tie], WEIGHTS)
  assert flat["overall"] == 0.0 and flat["by_domain"]["chat"]["matrix"] == [[0.0] * 3] * 3
  # A style that wins only against rejected responses of its own style or plainer.
  staircase = readers.rm_bench_row({**rows[0], "chosen": ["1", "2", "3"],
                                    "rejected": ["0.5", "1.5", "2.5"]}, "x")
  m = benchmarks.evaluate_rm_bench(numeric_scorer(), [staircase], WEIGHTS)["by_domain"]["chat"]
  assert (m["hard"], m["normal"], m["easy"]) == (0.0, 1.0, 1.0)


def test_rm_bench_row_not_scored_is_dropped():
  rows = rm_bench_rows()
  broken = {**rows[1], "rejected": ["unscored", "1", "2"]}
  records = [readers.rm_bench_row(r, "x") for r in [*rows, broken]]
  result = benchmarks.evaluate_rm_bench(numeric_scorer(), records, WEIGHTS)
  assert (result["count"], result["dropped"]) == (len(rows), 1)
  check_rm_bench(result, rows)


# ---------------------------------------------------------------- JudgeBench

DECISIONS = ("A>B", "B>A", "A=B", None)


def reference_judgebench_correct(label, judgment1, judgment2) -> bool:
  """JudgeBench's compute_final_metrics (reverse_order) for one pair, re-derived."""
  opposite = {"A>B": "B>A", "B>A": "A>B"}
  decisions = (judgment1, opposite.get(judgment2, judgment2))
  counter = sum(1 if d == label else -1 if d == opposite[label] else 0 for d in decisions)
  return counter > 0


def test_judgebench_swap_rule_matches_judgebench_on_every_decision_pair():
  for label, first, swapped in itertools.product(("A>B", "B>A"), DECISIONS, DECISIONS):
    assert benchmarks.judgebench_correct(label, first, swapped) == \
        reference_judgebench_correct(label, first, swapped), (label, first, swapped)
  # The cases by name (the swapped judgement is in the swapped frame: "B>A" there means A).
  assert benchmarks.judgebench_correct("A>B", "A>B", "B>A")        # agreement, right
  assert benchmarks.judgebench_correct("A>B", "A=B", "B>A")        # one tie, one right
  assert not benchmarks.judgebench_correct("A>B", "A=B", "A>B")    # one tie, one wrong
  assert not benchmarks.judgebench_correct("A>B", "A>B", "A>B")    # inconsistent
  assert not benchmarks.judgebench_correct("A>B", "A=B", "A=B")    # a tie both times
  assert benchmarks.judgebench_correct("B>A", None, "A>B")         # one judgement missing


SOURCES = ("mmlu-pro-law", "livebench-reasoning", "livebench-math", "livecodebench",
           "mmlu-pro-physics", "other-source")


def judgebench_rows() -> list[dict]:
  """JudgeBench pairs; two neighbours share a question (one context for a judge)."""
  gaps = (1.0, 0.25, 0.0, -1.0, 0.25, 2.0, -0.25)
  rows = []
  for i, gap in enumerate(gaps):
    label = "A>B" if i % 2 == 0 else "B>A"
    right, wrong = 1.0 + gap, 1.0
    a, b = (right, wrong) if label == "A>B" else (wrong, right)
    rows.append({"pair_id": f"p{i}", "original_id": i, "source": SOURCES[i % len(SOURCES)],
                 "question": "Shared question?" if i in (1, 2) else f"Question {i}?",
                 "response_model": "gpt-4o-2024-05-13", "response_A": _say(a, "first"),
                 "response_B": _say(b, "second"), "label": label})
  return rows


def reference_judgebench(rows: list[dict], bias: float) -> dict:
  """Both orders judged by rewards (JudgeBench's reward-model judges, with A=B on a tie,
  and a judge that favours the response shown first by `bias`), then the swap rule."""
  def judge(first, second):
    first += bias
    return "A>B" if first > second else "B>A" if first < second else "A=B"

  correct = defaultdict(list)
  for r in rows:
    a, b = float(r["response_A"].split()[0]), float(r["response_B"].split()[0])
    ok = reference_judgebench_correct(r["label"], judge(a, b), judge(b, a))
    correct[""].append(ok)
    for category, prefix in (("knowledge", "mmlu-pro"), ("reasoning", "livebench-reasoning"),
                             ("math", "livebench-math"), ("coding", "livecodebench")):
      if r["source"].startswith(prefix):
        correct[category].append(ok)
  return {k: float(np.mean(v)) for k, v in correct.items()}


def position_biased_judge(bias: float, seen: list):
  """A pairwise judge behind the scorer protocol: within each context group, the response
  shown first gains `bias`; records the groups' sizes."""
  score = fake_scorer.make_numeric(None)

  def judge(convs):
    out = score(convs)
    for group in context_groups(convs):
      seen.append(len(group))
      out[group[0], ATTRIBUTES.index("helpfulness")] += bias
    return out

  return judge


@pytest.mark.parametrize("bias", [0.0, 0.5])
def test_judgebench_judges_both_orders_as_groups_of_two(bias):
  rows = judgebench_rows()
  pairs = [readers.judgebench_pair(r, f"x:{i}") for i, r in enumerate(rows)]
  seen = []
  result = benchmarks.evaluate_judgebench(HostScorer(position_biased_judge(bias, seen)),
                                          pairs, WEIGHTS)
  assert seen == [2] * (2 * len(rows))  # each order of each pair one group of two
  want = reference_judgebench(rows, bias)
  assert result["accuracy"] == pytest.approx(want[""], abs=1e-12)
  assert result["count"] == len(rows) and result["unjudged"] == 0
  assert set(result["by_category"]) == {"knowledge", "reasoning", "math", "coding"}
  for category, m in result["by_category"].items():
    assert m["accuracy"] == pytest.approx(want[category], abs=1e-12), category
  assert result["by_category"]["knowledge"]["count"] == 3
  # Without a bias the orders agree and a tie (gap 0) is wrong; with it the gaps smaller
  # than the bias (0.25, 0, -0.25) flip with the order: inconsistent, so wrong.
  assert result["inconsistent"] == (0 if bias == 0 else 4)
  assert result["accuracy"] == pytest.approx(4 / 7 if bias == 0 else 2 / 7)


def test_judgebench_pair_not_scored_counts_as_missing_judgements():
  rows = judgebench_rows()[:2]
  rows[1] = {**rows[1], "response_A": "unscored"}
  pairs = [readers.judgebench_pair(r, "x") for r in rows]
  result = benchmarks.evaluate_judgebench(numeric_scorer(), pairs, WEIGHTS)
  assert (result["count"], result["unjudged"], result["accuracy"]) == (2, 1, 0.5)


def test_benchmarks_with_nothing_judged_report_nan_with_the_count():
  """A judge that judged nothing: every figure NaN beside its count of 0 (JudgeBench's
  0.000 before: an unjudged pair is wrong), in the results and the printed tables."""
  from helpsteer_jax.scoring import evaluate as rm_eval
  from helpsteer_jax.scoring import report as rm_report
  nothing = HostScorer(lambda convs: np.full((len(convs), len(ATTRIBUTES)), np.nan))
  pairs = [readers.judgebench_pair(r, "x") for r in judgebench_rows()]
  jb = benchmarks.evaluate_judgebench(nothing, pairs, WEIGHTS)
  assert np.isnan(jb["accuracy"]) and (jb["count"], jb["judged"]) == (len(pairs), 0)
  assert all(np.isnan(m["accuracy"]) and m["judged"] == 0 for m in jb["by_category"].values())
  assert f"| all | {len(pairs)} | 0 | nan |" in rm_report.set_table("judgebench", jb)
  rm = benchmarks.evaluate_rm_bench(
      nothing, [readers.rm_bench_row(r, "x") for r in rm_bench_rows()], WEIGHTS)
  assert np.isnan(rm["overall"]) and (rm["count"], rm["by_domain"]) == (0, {})
  assert "| all | 0 | nan | nan | nan | nan |" in rm_report.set_table("rm_bench", rm)
  rb2 = benchmarks.evaluate_rewardbench2(
      nothing, [readers.rewardbench2_row(r, "x") for r in rb2_rows()], WEIGHTS)
  assert np.isnan(rb2["score"]) and rb2["count"] == 0
  assert "| all | 0 | nan |" in rm_report.set_table("rewardbench2", rb2)
  pair = PreferencePair(with_response("p", "a", "x"), with_response("p", "b", "x"))
  rb = rm_eval.evaluate_pairs(nothing, [pair], WEIGHTS)
  assert np.isnan(rb["accuracy"]) and rb["count"] == 0
  assert "| all | 0 | 0 | nan |" in rm_report.set_table("rewardbench", rb)
  # a JudgeBench pair judged in one order still counts, with the other decision missing
  half = benchmarks.judgebench_scores([[2.0, 1.0]], [[np.nan, np.nan]], ["A>B"], ["mmlu-pro"])
  assert (half["accuracy"], half["judged"], half["unjudged"]) == (1.0, 1, 1)


# ---------------------------------------------------------------- RewardBench 2


def reference_best_of_n(scores) -> float:
  """reroll_and_score_dataset's result of one row: a tie at the maximum shared."""
  max_val = np.max(scores)
  return (1 / np.sum(np.asarray(scores) == max_val)) if scores[0] == max_val else 0


def reference_ties(rows: list[dict]) -> float:
  """process_single_model re-derived on {id, scores, num_correct} rows."""
  grouped = defaultdict(list)
  for row in rows:
    kind, number = row["id"].split(":")
    for i, s in enumerate(row["scores"]):
      grouped[(kind, int(number))].append((i < row["num_correct"], s))
  stats = {"ref": {}, "tied": {}}
  for (kind, number), samples in grouped.items():
    good = [s for c, s in samples if c]
    bad = [s for c, s in samples if not c]
    spread = max(good) - min(good) if len(good) > 1 else None
    stats[kind][number] = (min(good) - max(bad) > 0, spread, min(good) - max(bad))
  ref, tied = stats["ref"], stats["tied"]
  ref_acc = np.mean([s[0] for s in ref.values()]) if ref else 0.0
  tied_acc = np.mean([s[0] for s in tied.values()]) if tied else 0.0
  both = set(ref) & set(tied)
  spread = np.array([tied[p][1] for p in both], float)
  m_tied = np.array([tied[p][2] for p in both], float)
  m_ref = np.array([ref[p][2] for p in both], float)
  preferred = np.mean(m_tied > spread)
  hard = np.mean(np.minimum(m_ref, m_tied) > spread)
  with np.errstate(divide="ignore", invalid="ignore"):
    margin = np.nan_to_num(np.tanh(np.minimum(m_ref, m_tied) / spread - 1), nan=0.0)
  return 0.3 * tied_acc + 0.3 * ref_acc + 0.2 * preferred + 0.2 * hard + 0.01 * margin.mean()


def rb2_rows() -> list[dict]:
  """RewardBench 2 rows: best-of-4 subsets with ties at the maximum, and Ties prompts
  (a ref and a tied row each; one tied row without its ref; spreads of 0)."""
  def row(i, subset, chosen, rejected, num_correct=None, id_=None):
    out = {"id": id_ or str(i), "prompt": f"Prompt {i % 5}?", "subset": subset,
           "chosen": [_say(s, f"c{k}") for k, s in enumerate(chosen)],
           "rejected": [_say(s, f"r{k}") for k, s in enumerate(rejected)],
           "num_correct": num_correct if num_correct is not None else len(chosen)}
    return out

  return [
      row(0, "Factuality", [3], [1, 2, 0]),        # the best: 1
      row(1, "Factuality", [3], [3, 1, 0]),        # tied with one: 1/2
      row(2, "Factuality", [2], [2, 2, 0]),        # tied with two: 1/3
      row(3, "Factuality", [1], [3, 0, 0]),        # beaten: 0
      row(4, "Precise IF", [2], [1, 1, 1]),
      row(5, "Precise IF", [0], [0, 0, 0]),        # all equal: 1/4
      row(6, "Math", [1], [2, 0, 0]),
      row(7, "Ties", [5], [1, 2], id_="ref:0"),
      row(8, "Ties", [5, 4.5, 4.8], [1, 3], id_="tied:0"),
      row(9, "Ties", [2], [3], id_="ref:1"),       # inaccurate reference
      row(10, "Ties", [4, 4], [1], id_="tied:1"),  # spread 0, the ref's margin < 0: -inf
      row(11, "Ties", [3], [3], id_="ref:2"),
      row(12, "Ties", [3, 3], [3], id_="tied:2"),  # spread 0, margin 0: NaN -> 0
      row(13, "Ties", [6, 1], [2], id_="tied:3"),  # no reference row
  ]


def reference_rb2(rows: list[dict]) -> dict:
  scores = {r["id"] + r["subset"]: [float(x.split()[0]) for x in r["chosen"] + r["rejected"]]
            for r in rows}
  out = {}
  for subset in {r["subset"] for r in rows}:
    mine = [r for r in rows if r["subset"] == subset]
    if subset.lower() == "ties":
      out[subset] = reference_ties([{**r, "scores": scores[r["id"] + r["subset"]]}
                                    for r in mine])
    else:
      out[subset] = float(np.mean([reference_best_of_n(scores[r["id"] + r["subset"]])
                                   for r in mine]))
  return out


def test_rewardbench2_best_of_4_ties_subset_and_overall_match_reward_bench():
  rows = rb2_rows()
  records = [readers.rewardbench2_row(r, f"x:{i}") for i, r in enumerate(rows)]
  seen = []
  result = benchmarks.evaluate_rewardbench2(HostScorer(position_biased_judge(0.0, seen)),
                                            records, WEIGHTS)
  assert seen == [len(r.completions) for r in records]  # each row one group
  want = reference_rb2(rows)
  assert set(result["by_subset"]) == set(want)
  for subset, score in want.items():
    assert result["by_subset"][subset]["score"] == pytest.approx(score, abs=1e-12), subset
  assert result["by_subset"]["Factuality"]["score"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 4)
  assert result["by_subset"]["Precise IF"]["score"] == pytest.approx((1 + 1 / 4) / 2)
  ties = result["by_subset"]["Ties"]
  assert ties["ref_accuracy"] == pytest.approx(1 / 3)
  assert ties["tied_accuracy"] == pytest.approx(2 / 4)
  assert ties["correctness_preferred"] == pytest.approx(2 / 3)
  assert ties["correctness_preferred_hard"] == pytest.approx(1 / 3)
  assert ties["correctness_margin"] == pytest.approx((np.tanh(2.0) - 1 + 0) / 3)
  assert result["score"] == pytest.approx(np.mean(list(want.values())), abs=1e-12)
  assert (result["count"], result["dropped"]) == (len(rows), 0)


def test_rewardbench2_row_not_scored_is_dropped():
  rows = rb2_rows()[:4]
  rows.append({**rows[0], "rejected": ["unscored", "1", "0"]})
  records = [readers.rewardbench2_row(r, "x") for r in rows]
  result = benchmarks.evaluate_rewardbench2(numeric_scorer(), records, WEIGHTS)
  assert (result["count"], result["dropped"]) == (4, 1)
  assert result["score"] == pytest.approx(reference_rb2(rows[:4])["Factuality"])


# ---------------------------------------------------------------- readers


def write_json_list(path, rows):
  path.write_text(json.dumps(rows, indent=4, ensure_ascii=False))  # as RM-Bench ships it
  return path


def write_jsonl(path, rows):
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "wt") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  return path


def turns(convs) -> list:
  return [c.turns for c in convs]


def test_readers_read_the_released_schemas(tmp_path):
  rm_rows = rm_bench_rows()
  from_list = readers.read_rm_bench(write_json_list(tmp_path / "total_dataset.json", rm_rows))
  from_jsonl = readers.read_rm_bench(write_jsonl(tmp_path / "rm.jsonl.gz", rm_rows))
  assert [r.id for r in from_list] == [str(r["id"]) for r in rm_rows]
  assert [(r.domain, turns(r.conversations)) for r in from_list] == \
      [(r.domain, turns(r.conversations)) for r in from_jsonl]
  assert from_list[0].chosen[2].turns[-1].text == rm_rows[0]["chosen"][2]
  assert from_list[0].chosen[0].turns[0].text == "Question 0?"

  jb = readers.read_judgebench(write_jsonl(tmp_path / "jb.jsonl", judgebench_rows()))
  assert [(p.category, p.label) for p in jb[:2]] == [("knowledge", "A>B"),
                                                       ("reasoning", "B>A")]
  assert jb[5].category == "" and jb[0].response_b.turns[-1].text == "1.0 second"

  rb = rb2_rows()
  table = pa.table({k: [r[k] for r in rb] for k in rb[0]})
  pq.write_table(table, tmp_path / "test.parquet")  # the hub's data/test-*.parquet
  from_parquet = readers.read_rewardbench2(tmp_path)  # a directory: {split}.parquet
  from_jsonl = readers.read_rewardbench2(write_jsonl(tmp_path / "rb2.jsonl", rb))
  assert [(r.id, r.subset, r.num_correct, turns(r.completions)) for r in from_parquet] == \
      [(r.id, r.subset, r.num_correct, turns(r.completions)) for r in from_jsonl]
  assert from_parquet[8].ties_key() == ("tied", 0) and from_parquet[8].num_correct == 3
  no_count = {k: v for k, v in rb[8].items() if k != "num_correct"}
  assert readers.rewardbench2_row(no_count, "x").num_correct == 3  # the chosen


BAD_ROWS = [
    ("rm_bench", {"chosen": ["1", "2"]}, "does not hold 3 responses"),
    ("rm_bench", {"domain": "poetry"}, "unknown RM-Bench domain"),
    ("rm_bench", {"rejected": "1 2 3"}, "wrong type for 'rejected'"),
    ("rm_bench", {"id": None}, "missing field 'id'"),
    ("judgebench", {"label": "A=B"}, "unknown JudgeBench label"),
    ("judgebench", {"response_B": ""}, "empty response_B"),
    ("rewardbench2", {"id": "tied-4"}, "Ties id not ref:<n> or tied:<n>"),
    ("rewardbench2", {"num_correct": 1}, "needs two correct"),
    ("rewardbench2", {"num_correct": 5}, "num_correct outside"),
    ("rewardbench2", {"rejected": []}, "empty rejected"),
]
GOOD = {"rm_bench": (rm_bench_rows, readers.read_rm_bench, 0),
        "judgebench": (judgebench_rows, readers.read_judgebench, 0),
        "rewardbench2": (rb2_rows, readers.read_rewardbench2, 8)}


@pytest.mark.parametrize("name,change,message", BAD_ROWS)
def test_a_bad_row_names_its_file_and_line(tmp_path, name, change, message):
  make, read, index = GOOD[name]
  rows = make()
  rows[index] = {**rows[index], **change}
  if name == "rm_bench":  # the JSON list: the line its object starts on
    path = write_json_list(tmp_path / "total_dataset.json", rows)
    text = path.read_text()
    line = text[:text.index("{")].count("\n") + 1
  else:
    path, line = write_jsonl(tmp_path / "rows.jsonl", rows), index + 1
  with pytest.raises(DataError, match=f"{path.name}:{line}: .*{message}"):
    read(path)
  report = BadRecordReport()
  assert len(read(path, on_bad_record="skip", report=report)) == len(rows) - 1
  assert report.total == 1


def test_a_broken_json_list_names_its_line(tmp_path):
  path = tmp_path / "total_dataset.json"
  path.write_text("[\n" + json.dumps(rm_bench_rows()[0]) + ',\n  {"id": 2,, }\n]')
  with pytest.raises(DataError, match="total_dataset.json:3: malformed JSON"):
    readers.read_rm_bench(path)


# ---------------------------------------------------------------- evaluate_rm


@pytest.fixture(scope="module")
def benchmark_files(tmp_path_factory):
  root = tmp_path_factory.mktemp("benchmarks")
  rb = rb2_rows()
  pq.write_table(pa.table({k: [r[k] for r in rb] for k in rb[0]}), root / "rb2.parquet")
  return {"rm_bench_path": str(write_json_list(root / "total_dataset.json", rm_bench_rows())),
          "judgebench_path": str(write_jsonl(root / "jb.jsonl", judgebench_rows())),
          "rewardbench2_path": str(root / "rb2.parquet")}


def _numeric_config(**data):
  cfg = short_config("evaluate_rm", scorer={"source": "fake_scorer:make_numeric"}, data=data)
  for name in cfg.scorer.weights:
    cfg.scorer.weights[name] = float(name == "helpfulness")
  return cfg


def test_evaluate_rm_reports_the_benchmarks(benchmark_files, tmp_path, capsys):
  report = evaluate_rm.run(_numeric_config(**benchmark_files), str(tmp_path / "eval"))
  out = capsys.readouterr().out
  assert "helpsteer2_preference" not in report and "attributes" not in report  # no demo
  check_rm_bench(report["rm_bench"], rm_bench_rows())
  assert report["judgebench"]["accuracy"] == pytest.approx(
      reference_judgebench(judgebench_rows(), 0.0)[""])
  want = reference_rb2(rb2_rows())
  assert report["rewardbench2"]["score"] == pytest.approx(np.mean(list(want.values())))
  saved = json.loads((tmp_path / "eval" / "rm_report.json").read_text())
  assert saved["rm_bench"]["overall"] == pytest.approx(report["rm_bench"]["overall"])
  assert "| RM-Bench | n | hard | normal | easy | average |" in out
  assert "| JudgeBench | n | judged | accuracy |" in out and "| Ties | 7 |" in out


def test_evaluate_rm_variants_report_the_benchmarks(benchmark_files, tmp_path, capsys):
  cfg = _numeric_config(**benchmark_files)
  cfg.variants = "numbers=fake_scorer:make_numeric@helpfulness,weighted=fake_scorer:make_numeric"
  report = evaluate_rm.run(cfg, str(tmp_path / "eval"))
  table = capsys.readouterr().out
  assert "| variant | reward | RM-Bench | JudgeBench | RewardBench 2 |" in table
  numbers = report["variants"]["numbers"]
  assert numbers["rm_bench"] == report["variants"]["weighted"]["rm_bench"]
  assert numbers["rm_bench"]["overall"] == pytest.approx(
      reference_rm_bench(rm_bench_rows())["overall"])
  assert numbers["judgebench"]["count"] == len(judgebench_rows())
  # each figure with the count it was computed over
  rm = numbers["rm_bench"]
  assert f"| numbers | helpfulness | {rm['overall']:.3f} ({rm['count']}) |" in table
