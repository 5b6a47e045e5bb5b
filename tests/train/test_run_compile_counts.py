"""train/run.py: what each stage compiled, logged per stage (mtrl_jax/compile/counts.py's Laps).

The stages are stood in for by functions that compile a known number of new
programs (numpy inputs of shapes no other test uses), so each stage's record
must count exactly its own. Break checked: Laps.lap not moving its start
(every record the running total since the run began, the summary's per-stage
numbers cumulative) -> the sft record counts 3 programs, not 1.
"""
import jax
import jax.numpy as jnp
import numpy as np

from mtrl_jax.compile.counts import Laps
from mtrl_jax.config import base_config
from mtrl_jax.metrics import read_metrics
from mtrl_jax.train.run import Run


def _compile(n: int, tag: float) -> None:
  """n programs XLA has not seen in this process: new functions at shapes (977 + k, tag) used nowhere else."""
  for k in range(n):
    jax.jit(lambda x, k=k: jnp.sin(x) * tag + k)(np.ones((977 + k, int(tag)), np.float32)).block_until_ready()


def test_each_stage_logs_what_it_compiled_and_the_summary_the_whole_run(tmp_path, monkeypatch):
  c = base_config()
  c.env.name, c.env.kwargs = "bifurcation", {"length": 1}
  c.model.update(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, mlp_dim=32)
  c.critic.kind = "none"
  c.stages = ("demos", "sft")
  c.checkpoint.update(async_save=False)
  c.log.tensorboard = False
  monkeypatch.setattr(Run, "stage_demos", lambda self: _compile(2, 3.0))
  monkeypatch.setattr(Run, "stage_sft", lambda self: _compile(1, 5.0))
  run = Run(c, str(tmp_path))
  summary = run.run()
  got = {}
  for r in read_metrics(str(tmp_path)):
    if r["stage"] == "compile":
      got.update({k.split("/")[1]: v for k, v in r.items() if k.endswith("/programs")})
  assert got["demos"] == 2 and got["sft"] == 1, got
  assert summary["compile/programs"] == got["startup"] + 3


def test_laps_count_between_laps_and_in_all():
  """Each lap counts what was compiled since the last one; total() the whole span."""
  laps = Laps()
  _compile(2, 7.0)
  assert laps.lap().programs == 2
  _compile(1, 9.0)
  assert laps.lap().programs == 1
  assert laps.lap().programs == 0
  assert laps.total().programs == 3
