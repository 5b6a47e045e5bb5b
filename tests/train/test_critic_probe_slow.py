"""Issue 43's probe end to end: the study's warm start on `delayed(cue=True)`, then value pretraining
at the config's defaults must hand RL a critic at >= 0.8 of the oracle critic's explained variance,
within the default cap, and say why it stopped.

Measured (docs/critic.md, "What it costs"): see TIMING below. Slow: a real warm start (1000 demos,
600 SFT steps) and a real value-pretraining stage.
"""
import time

import pytest

from mtrl_jax.train.critic_bar import CRITIC_BAR
from mtrl_jax.train.run import Run

# Wall seconds this test took (horizon 2, seed 0, 2-core x86_64 CPU), filled in from the measured run.
TIMING = "not measured yet"


def _cell(stage: str, seed: int = 0):
  from configs.study import get_config
  c = get_config(f"probe=delayed,horizon=2,stage={stage},seed={seed}")
  with c.unlocked():
    c.env.kwargs.cue = True
  return c


@pytest.mark.slow
def test_default_value_pretraining_reaches_the_bar_on_the_cued_probe(tmp_path):
  """The critic's final readout (256 fresh tasks, configs/study.py) has EV >= 0.8 x the oracle's
  (the ratio's point and its interval's lower end), and the stage stopped before its caps.

  Breaks checked (docs/critic.md): the old fixed budget (`value_pretrain.steps=160`, no stopping
  rule) ends below the bar on the probe at horizon 8 (issue 43's measurement; at horizon 2 the
  critic learns sooner); a stopping rule without patience (patience 1) stops inside the flat stretch."""
  t0 = time.time()
  warm = str(tmp_path / "warm")
  Run(_cell("warm"), warm).run()
  c = _cell("critic")
  c.init_from = warm
  out = Run(c, str(tmp_path / "critic")).run()
  secs = time.time() - t0
  print(f"warm start + value pretraining: {secs:.0f} s; {out['critic']}; rounds {out['value_pretrain/rounds']}, "
        f"critic steps {out['value_pretrain/critic_steps']}")
  assert out["value_pretrain/ev_over_oracle"] >= CRITIC_BAR, out
  assert out["value_pretrain/ev_over_oracle_lo"] >= CRITIC_BAR, out
  assert out["value_pretrain/critic_steps"] < c.value_pretrain.steps, out
  assert out["critic"].startswith("critic at the bar")
