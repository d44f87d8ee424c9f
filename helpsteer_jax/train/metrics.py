"""Training telemetry: metrics.jsonl, TensorBoard events, a progress bar, MFU."""

from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Any, Mapping

import jax

from helpsteer_jax import processes

# Dense bf16 peak FLOP/s per chip, from the vendors' data sheets.
PEAK_FLOPS = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
    "TPU v5": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
    "NVIDIA H100": 989e12, "NVIDIA H200": 989e12, "NVIDIA A100": 312e12,
}


def peak_flops_per_device(configured: float = 0.0, cpu_peak: float = 190e9) -> float:
  """The configured peak, else the data-sheet figure of this device kind.

  On CPU the fake devices share one machine: `cpu_peak` is for the whole
  process (a measured fp32 matmul rate), divided among the local devices.
  """
  if configured > 0:
    return configured
  device = jax.devices()[0]
  if device.platform == "cpu":
    return cpu_peak / jax.local_device_count()
  for name, flops in PEAK_FLOPS.items():
    if device.device_kind.startswith(name):
      return flops
  return 0.0


def _summary_writer_class() -> type:
  """tensorboardX's `SummaryWriter`, imported without the PyTorch it probes for: it takes
  Python floats either way, and importing PyTorch would slow every training start."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError: tensorboardX's fallback
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricsWriter:
  """Writes scalars to `metrics.jsonl` and TensorBoard (process 0 only)."""

  def __init__(self, workdir: str | pathlib.Path, enabled: bool | None = None):
    self.enabled = processes.is_primary() if enabled is None else enabled
    self._jsonl = None
    self._tb = None
    if self.enabled:
      workdir = pathlib.Path(workdir)
      workdir.mkdir(parents=True, exist_ok=True)
      self._jsonl = open(workdir / "metrics.jsonl", "a", encoding="utf-8")
      self._tb = _summary_writer_class()(str(workdir / "tensorboard"))

  def write(self, step: int, scalars: Mapping[str, Any], prefix: str = "") -> None:
    if not self.enabled:
      return
    clean = {f"{prefix}{k}": float(v) for k, v in scalars.items()}
    self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **clean}) + "\n")
    self._jsonl.flush()
    for k, v in clean.items():
      self._tb.add_scalar(k, v, int(step))
    self._tb.flush()

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


def last_logged(workdir: str | pathlib.Path, step: int) -> dict[str, float]:
  """The training scalars metrics.jsonl holds for `step` ({} if none).

  A run resumed at its final step trains no step; its result reports what the
  run that reached that step logged.
  """
  path = pathlib.Path(workdir) / "metrics.jsonl"
  last = {}
  if path.exists():
    for line in path.read_text(encoding="utf-8").splitlines():
      try:
        record = json.loads(line)
      except json.JSONDecodeError:  # a line cut short by a preemption
        continue
      if record.get("step") == step and "loss" in record:
        last = {k: v for k, v in record.items() if k not in ("step", "time")}
  return last
