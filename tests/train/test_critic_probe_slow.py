"""Issue 43's probe end to end: the study's warm start on `delayed(cue=True)`, then value pretraining
at the config's defaults must hand RL a critic at >= 0.8 of the oracle critic's explained variance,
within the default cap, and say why it stopped.

Measured (docs/critic.md): see TIMING below. Slow: a real warm start (1000 demos, 600 SFT steps)
and a real value-pretraining stage.
"""
import time

import pytest

from mtrl_jax.train.critic_bar import CRITIC_BAR
from mtrl_jax.train.run import Run

# Measured 2026-11-28 on a 2-core x86_64 CPU shared with other jobs (load average 17-25): 1,009 s
# wall in all: the warm start (1000 demos, 600 SFT steps) ~4 min, value pretraining 638 s on the
# stage's clock (23 rounds, 184 critic steps, stopped at the bar) and its final readout (256 tasks)
# ~2 min; the critic handed to RL: EV 0.332 = 0.97 [0.96, 0.98] of the oracle's 0.343.
# Again at 31f68a4+ (2026-11-28, load 2-4: one other training process on the 2 cores): 380 s.
TIMING = "1009 s (load 17-25 on 2 cores); 380 s (load 2-4)"


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

  What it would catch: a stage that stops inside the flat stretch before the rise (issue 43's
  failure: EV ~0 for ~16 rounds on this probe, docs/critic.md's pilot), a cap below what the
  probe needs, or a readout that cannot judge the bar. Not break-checked here (a run costs 6-17 min
  on the 2-core CPU); the rule's breaks are checked on synthetic sequences in test_vp_stop.py."""
  t0 = time.time()
  warm = str(tmp_path / "warm")
  Run(_cell("warm"), warm).run()
  c = _cell("critic")
  c.init_from = warm
  out = Run(c, str(tmp_path / "critic")).run()
  secs = time.time() - t0
  print(f"warm start + value pretraining: {secs:.0f} s (measured once: {TIMING}); {out['critic']}; rounds {out['value_pretrain/rounds']}, "
        f"critic steps {out['value_pretrain/critic_steps']}")
  assert out["value_pretrain/ev_over_oracle"] >= CRITIC_BAR, out
  assert out["value_pretrain/ev_over_oracle_lo"] >= CRITIC_BAR, out
  assert out["value_pretrain/critic_steps"] < c.value_pretrain.steps, out
  assert out["critic"].startswith("critic at the bar")
