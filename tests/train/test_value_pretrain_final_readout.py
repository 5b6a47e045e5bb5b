"""Value pretraining's final readout: the critic handed to RL, scored on `readout_tasks` fresh tasks
played in rounds of `tasks_per_round` and read as one set, with session-bootstrap intervals.
"""
import numpy as np
import pytest

from mtrl_jax.config import base_config, validate
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.train import critic_readout as cr
from mtrl_jax.train import value_pretrain
from mtrl_jax.train.run import Run

ROUNDS, TASKS, GROUP, READOUT_TASKS = 2, 2, 4, 5  # 5 tasks: three rounds of 2


def _config():
  c = base_config()
  c.env.name, c.env.kwargs = "bifurcation", {"length": 1}  # a closed-form oracle (Env.decision_value)
  c.model.update(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  c.critic.kind = "separate"
  c.stages = ("value_pretrain",)
  c.rl.update(estimator="gae", steps=1, tasks_per_update=2, group_size=GROUP, minibatches=1, warmup_steps=0)
  c.rl.estimator_kwargs = {"lambda_policy": 0.95, "lambda_critic": 0.95}
  c.value_pretrain.update(steps=ROUNDS, tasks_per_round=TASKS, epochs=1, minibatches=1, lr=0.05,
                          warmup_steps=0, patience=0, readout_tasks=READOUT_TASKS)
  c.rollout.update(turn_budget=4, context_cap=160, env_threads=2)
  c.checkpoint.update(every=10**6, async_save=False)
  c.log.tensorboard = False
  return c


@pytest.fixture(scope="module")
def record(tmp_path_factory):
  """One value-pretraining stage, with the engine's task seeds and the final readout's batches recorded."""
  got = {"seeds": [], "final": []}
  with pytest.MonkeyPatch.context() as mp:
    real_run, real_final = RolloutEngine.run, value_pretrain.ValuePretrainer.final_readout

    def engine_run(self, seeds, *a, **kw):
      got["seeds"].append([int(s) for s in seeds])
      return real_run(self, seeds, *a, **kw)

    def final_readout(self, batches):
      out = real_final(self, batches)
      got["final"].append((list(batches), out, self.learner))
      got["pretrainer"] = self
      return out

    mp.setattr(RolloutEngine, "run", engine_run)
    mp.setattr(value_pretrain.ValuePretrainer, "final_readout", final_readout)
    run = Run(_config(), str(tmp_path_factory.mktemp("vp")))
    got["out"] = run.stage_value_pretrain()
    run.ckpt.close()
  return got


def test_final_readout_plays_enough_fresh_rounds(record):
  """readout_tasks=5 at 2 tasks a round: three fresh rounds after the two training rounds, each on
  task seeds no other round played; readout_sessions counts all their sessions (3 x 2 x 4).

  Breaks caught: the final readout on one round only (the old path: 8 sessions), or every readout
  round replaying the same round's tasks (`source.next_batch(total)` each time: seeds repeat)."""
  seeds = record["seeds"]
  assert len(seeds) == ROUNDS + 3
  flat = [s for round_ in seeds for s in round_]
  assert len(set(flat)) == len(flat), seeds
  (batches, out, _), = record["final"]
  assert len(batches) == 3
  rows = sum(int((pb.loss_mask_bt.sum(1) > 0).sum()) for _, pb, _ in batches)
  assert rows == 3 * TASKS * GROUP
  assert record["out"]["value_pretrain/readout_sessions"] == rows


def test_final_readout_is_the_readout_of_the_rounds_concatenated(record):
  """The final point values are critic_readout.readout on the rounds' rows stacked by this test
  (each round padded to a wider width of its own choosing: padding must not matter), with group
  ids kept apart across rounds; the intervals bracket the points and are written with them.

  Breaks caught: targets of one round used for another (round 0's for all: checked), or the intervals
  left out of the record (boot=0: checked)."""
  (batches, out, L), = record["final"]
  width = max(pb.tokens_bt.shape[1] for _, pb, _ in batches) + 7
  pad = lambda x: np.pad(np.asarray(x, np.float64), [(0, 0), (0, width - np.shape(x)[1])])  # noqa: E731
  v, t, m, turn, first, group = [], [], [], [], [], []
  for k, (sessions, pb, values) in enumerate(batches):
    v.append(pad(values)), t.append(pad(L.mc_targets(pb))), m.append(pad(pb.loss_mask_bt))
    turn.append(pad(pb.turn_idx_bt).astype(np.int64))
    first += [sessions[i].turns[0].action if i >= 0 else None for i in pb.session_index_b]
    group.append(np.asarray(pb.group_id_b) + 1000 * k)
  want = cr.readout(np.concatenate(v), np.concatenate(t), np.concatenate(m), np.concatenate(turn),
                    first_actions_b=first, group_b=np.concatenate(group), decision_fn=L.decision_fn,
                    value_fn=L.decision_value)
  assert {k: out[k] for k in want} == pytest.approx(want, abs=1e-9)
  rec = record["out"]
  for k in ("explained_variance", "oracle_explained_variance"):
    assert rec[f"value_pretrain/{k}"] == pytest.approx(want[k], abs=1e-9)
    assert rec[f"value_pretrain/{k}_lo"] <= want[k] <= rec[f"value_pretrain/{k}_hi"]
  assert rec["value_pretrain/explained_variance_lo"] < rec["value_pretrain/explained_variance_hi"]
  # The untrained policy rarely picks an arm here (its replies are mostly invalid), so the oracle's
  # EV can be 0 and the ratio undefined (NaN ends, written as null); the keys are there all the same.
  assert "value_pretrain/ev_over_oracle_lo" in rec and "value_pretrain/ev_over_oracle_hi" in rec


def test_final_readout_ignores_padding_width(record):
  """One round padded 64 columns wider (as a longer round's bucket would) reads the same numbers,
  intervals included: the rounds are aligned on their first column when stacked.

  Break caught: a round's values (or targets, mask, turns) padded on the wrong side when the rounds'
  widths differ (they did not differ in this run, so the test above cannot see it)."""
  (batches, out, _), = record["final"]
  wide = lambda x: None if x is None else np.pad(np.asarray(x), [(0, 0), (0, 64)])  # noqa: E731
  sessions, pb, values = batches[1]
  pb_wide = pb._replace(**{f: wide(getattr(pb, f)) for f in pb._fields if f.endswith("_bt")})
  again = value_pretrain.ValuePretrainer.final_readout(
      record["pretrainer"], [batches[0], (sessions, pb_wide, wide(values)), batches[2]])
  assert again == pytest.approx(out, abs=1e-9, nan_ok=True)


@pytest.mark.parametrize("readout_tasks,per_round,rounds", [(0, 32, 1), (1, 32, 1), (32, 32, 1), (33, 32, 2),
                                                            (1024, 32, 32)])
def test_readout_rounds(readout_tasks, per_round, rounds):
  """0 keeps the old single round; otherwise enough rounds for readout_tasks (rounded up).

  Break caught: floor division (33 tasks read on one round of 32) or 0 playing no round."""
  c = base_config().value_pretrain
  c.update(readout_tasks=readout_tasks, tasks_per_round=per_round)
  assert value_pretrain.readout_rounds(c) == rounds


def test_negative_readout_tasks_is_refused_naming_the_field():
  """Break caught: the field left unvalidated (a negative count silently reads one round)."""
  c = base_config()
  c.value_pretrain.readout_tasks = -1
  with pytest.raises(ValueError, match="value_pretrain.readout_tasks"):
    validate(c)

