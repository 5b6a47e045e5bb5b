"""Metric writers (JSONL, TensorBoard, console) for the main job.

Every record is flat: `{"step": int, "stage": str, **scalars}` so that
`metrics.jsonl` can be read back line by line by plots and tests. Values are
pulled off the device only here, on log steps.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Mapping

import numpy as np


def _scalar(v):
  v = np.asarray(v)
  if v.size != 1:
    raise ValueError(f"metric value of shape {v.shape} is not a scalar")
  v = v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return None if math.isnan(v) else (1e30 if v > 0 else -1e30)
  return v


def flatten(d: Mapping, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, Mapping):
      out.update(flatten(v, key + "/"))
    else:
      out[key] = v
  return out


class MetricsWriter:
  """Appends to `<workdir>/metrics.jsonl` and, if available, TensorBoard events."""

  def __init__(self, workdir: str, *, tensorboard: bool = True, is_main_process: bool = True):
    self.enabled = is_main_process
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if self.enabled:
      os.makedirs(workdir, exist_ok=True)
      if tensorboard:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(os.path.join(workdir, "tb"), flush_secs=30)

  def write(self, step: int, stage: str, metrics: Mapping) -> dict:
    record = {"step": int(step), "stage": stage}
    for k, v in flatten(metrics).items():
      try:
        record[k] = _scalar(v)
      except (TypeError, ValueError):
        continue  # non-scalars (histograms) go to TensorBoard only
    if not self.enabled:
      return record
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in flatten(metrics).items():
        arr = np.asarray(v)
        if arr.size == 1 and np.isfinite(arr).all():
          self._tb.add_scalar(f"{stage}/{k}", float(arr), step)
        elif arr.ndim == 1 and arr.size > 1 and k.endswith("_hist"):
          self._tb.add_histogram(f"{stage}/{k}", arr, step)
    return record

  def close(self):
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict]:
  """The records of `<workdir>/metrics.jsonl`; a half-written line (a run killed mid-write) is skipped."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  out = []
  with open(path) as f:
    for line in f:
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out


def say(msg: str, stream=None) -> None:
  """A stage-level message on stderr (absl INFO is left to library chatter)."""
  stream = stream or sys.stderr
  stream.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
  stream.flush()


class Progress:
  """A one-line console progress bar with rate, ETA and a few key numbers.

  `quiet_s`: draws nothing until that many seconds have passed since the bar
  was made, so work that ends sooner (a short eval between updates) leaves no line.
  """

  def __init__(self, stage: str, total: int, start: int = 0, stream=None, width: int = 24,
               quiet_s: float = 0.0):
    self.stage, self.total, self.start = stage, max(int(total), 1), int(start)
    self.quiet_s = float(quiet_s)
    self.t0 = time.time()
    self.stream = stream or sys.stderr
    self.width = width
    self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
    self._last_print = 0.0

  def update(self, step: int, **numbers):
    now = time.time()
    if now - self.t0 < self.quiet_s:
      return
    done = step - self.start
    rate = done / max(now - self.t0, 1e-9)
    eta = (self.total - step) / rate if rate > 0 else float("inf")
    frac = min(step / self.total, 1.0)
    bar = "#" * int(frac * self.width) + "." * (self.width - int(frac * self.width))
    nums = " ".join(f"{k}={_fmt(v)}" for k, v in numbers.items())
    line = f"[{self.stage}] |{bar}| {step}/{self.total} {rate:.2f}it/s eta {_fmt_time(eta)} {nums}"
    # On a terminal, redraw in place; in a log file, print at most every 5 s.
    if self._tty:
      self.stream.write("\r" + line[:200])
      if step >= self.total:
        self.stream.write("\n")
    elif now - self._last_print > 5 or step >= self.total or done <= 1:
      self.stream.write(line + "\n")
      self._last_print = now
    self.stream.flush()


def _fmt(v):
  v = np.asarray(v).item() if hasattr(v, "shape") else v
  return f"{v:.3g}" if isinstance(v, float) else str(v)


def _fmt_time(s: float) -> str:
  if not math.isfinite(s):
    return "?"
  s = int(s)
  return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
