"""A stop at the bar must be confirmed by the handed-over critic's own readout.

The pooled window mixes the critics of its last rounds and each round's oracle EV swings with its
batch: a pilot at H=32 stopped on a window of 0.948 [0.872, 1.03] and handed RL a critic that read
0.419 [0.33, 0.51] on 256 fresh tasks. Here the rounds' window is scripted to read at the bar from
round 1 on and the confirmation readouts are scripted too, so the stage's handling is what is
compared: which tasks each readout plays, when the bar may fire again, and which readout RL gets.
"""
import numpy as np
import pytest

from mtrl_jax.train import value_pretrain, vp_stop
from mtrl_jax.train.run import Run

from test_user_env_critic_bar import _config  # a user's env, a tiny model (registered there)

AT_BAR = (0.95, 0.85, 1.05)  # a pooled window at the bar: (ratio, lo, hi)
BELOW = {"explained_variance": 0.1, "oracle_explained_variance": 0.25, "ev_over_oracle_lo": 0.3,
         "ev_over_oracle_hi": 0.5, "readout_sessions": 64.0}
ABOVE = {"explained_variance": 0.24, "oracle_explained_variance": 0.25, "ev_over_oracle_lo": 0.86,
         "ev_over_oracle_hi": 1.05, "readout_sessions": 64.0}


def _stage(tmp_path, readouts, window=2, steps=12):
  """value pretraining with every round's pooled window at the bar and the final readouts scripted
  (`readouts`, one per call); returns the stage's output, the rounds whose batches each readout
  played, the rounds played and the checkpoint's meta."""
  c = _config()
  c.stages = ("value_pretrain",)
  c.value_pretrain.update(steps=steps, patience=0, window=window, readout_tasks=16, tasks_per_round=8)
  played, reads = [], []
  with pytest.MonkeyPatch.context() as mp:
    real_next = value_pretrain.SyncSource.next_batch

    def next_batch(self, step):
      played.append(step)
      return real_next(self, step)

    def final_readout(self, batches):
      reads.append(len(played))
      return dict(readouts[len(reads) - 1])

    mp.setattr(value_pretrain.SyncSource, "next_batch", next_batch)
    mp.setattr(value_pretrain.ValuePretrainer, "final_readout", final_readout)
    mp.setattr(value_pretrain, "_round_record",
               lambda held_out, stats, seed: vp_stop.RoundRecord(float(held_out["r2"]), *AT_BAR, AT_BAR[0]))
    run = Run(c, str(tmp_path))
    out = run.stage_value_pretrain()
    run.ckpt.close()
  # the batches each readout played: the steps drawn since the previous readout that are >= the cap
  total = value_pretrain.rounds_for(c.value_pretrain)
  per_read, last = [], 0
  for n in reads:
    per_read.append([s for s in played[last:n] if s >= total])
    last = n
  return out, per_read, [s for s in played if s < total], run.meta


def test_a_confirmed_bar_stops_at_once_on_the_readout_it_always_played(tmp_path):
  """The window fires at round 0; its readout is at the bar: the stage stops there, after one readout
  of the tasks the final readout always played (rounds total, total + 1), and that readout is the one
  RL gets. Break checked: the confirmation readout drawn from `total + 1 + k` (its tasks would differ
  from every critic built before the check existed)."""
  out, per_read, rounds, _ = _stage(tmp_path, [ABOVE])
  total = 12  # steps 12 at 1 epoch x 1 minibatch: one critic step a round
  assert rounds == [0]
  assert per_read == [[total, total + 1]]  # 16 tasks in rounds of 8
  assert out["value_pretrain/stopped_at_bar"] == 1.0 and out["value_pretrain/readouts"] == 1
  assert out["value_pretrain/ev_over_oracle"] == pytest.approx(0.24 / 0.25)


def test_an_unconfirmed_bar_fits_on_and_hands_over_the_confirmed_critic(tmp_path):
  """The window fires at round 0, but the readout reads 0.4 [0.3, 0.5]: the stage keeps fitting, lets
  the bar fire again only `window` (2) rounds later (round 3), reads the critic there on tasks no
  earlier readout played, and stops with that second readout. Breaks checked: the unconfirmed stop
  kept (stops at round 0 with the 0.4 readout: rounds [0], ratio 0.4); the window not held back (the
  second readout at round 1); the second readout replaying the first's tasks."""
  out, per_read, rounds, meta = _stage(tmp_path, [BELOW, ABOVE])
  total = 12
  assert rounds == [0, 1, 2, 3]
  assert per_read == [[total, total + 1], [total + 2, total + 3]]
  assert out["value_pretrain/stopped_at_bar"] == 1.0 and out["value_pretrain/readouts"] == 2
  assert out["value_pretrain/ev_over_oracle"] == pytest.approx(0.24 / 0.25)
  assert (meta["vp_readouts"], meta["vp_bar_from"]) == (2, 3)


def test_a_bar_never_confirmed_ends_at_the_cap_with_a_fresh_readout(tmp_path):
  """Every readout below the bar: the window fires at rounds 0, 3 and 6 (every window + 1 rounds),
  the stage ends at its cap of 8 rounds (reason 'steps'), and the critic RL gets is read once more on
  fresh tasks. Break checked: the cap's readout reusing attempt 0's tasks (total, total + 1)."""
  out, per_read, rounds, _ = _stage(tmp_path, [BELOW] * 4, steps=8)
  total = 8
  assert rounds == list(range(8))
  assert per_read == [[total, total + 1], [total + 2, total + 3], [total + 4, total + 5],
                      [total + 6, total + 7]]
  assert out["value_pretrain/stopped_at_steps"] == 1.0 and out["value_pretrain/readouts"] == 4
  assert out["value_pretrain/ev_over_oracle"] == pytest.approx(0.4)
  assert np.isfinite(out["value_pretrain/ev_over_oracle_lo"])
