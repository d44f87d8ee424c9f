"""What a task prints when it ends: its outputs, where they are, and its eval metrics."""

from helpsteer_jax.runs import summary


def test_the_outputs_that_exist_are_named_with_their_paths(tmp_path, capsys):
  (tmp_path / "hf").mkdir()
  (tmp_path / "metrics.jsonl").write_text("")
  summary.write_summary(tmp_path / "summary.json", {"status": "finished"}, "task: done",
                        outputs=summary.run_outputs(tmp_path))
  out = capsys.readouterr().out.splitlines()
  assert out == ["task: done", "wrote:", f"  HF model  {tmp_path / 'hf'}/",
                 f"  metrics   {tmp_path / 'metrics.jsonl'}",
                 f"  summary   {tmp_path / 'summary.json'}"]  # no checkpoints/: not there


def test_eval_metrics_text_is_empty_without_metrics():
  assert summary.metrics_text({}) == ""
  assert summary.metrics_text({"loss": 1.5, "accuracy": 0.25}) == (
      "; eval loss 1.5000, accuracy 0.2500")


def test_only_a_preempted_run_exits_with_the_preemption_status():
  assert summary.exit_status({"status": "preempted"}) == summary.PREEMPTED_EXIT == 3
  for finished in ({"status": "finished"}, {"status": "stopped"}, {"mode": "chat"}, None):
    assert summary.exit_status(finished) == 0
