"""Value pretraining's per-round readout is held out: it scores the critic as it
was before fitting that round's batch (issue 34).

test_run_stages.py scripts the readout's numbers to drive early stopping, so it
cannot see which critic the readout scored; this test records the critic's
values on each round's batch just before that round's fit and compares them
with the values the readout was given.
"""
import jax
import numpy as np
import pytest

from mtrl_jax.config import base_config
from mtrl_jax.train import value_pretrain
from mtrl_jax.train.run import Run

ROUNDS = 2


def _config(critic: str):
  c = base_config()
  c.env.name, c.env.kwargs = "bifurcation", {"length": 1}
  c.model.update(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  c.critic.kind = critic
  c.stages = ("value_pretrain",)
  c.rl.update(estimator="gae", steps=1, tasks_per_update=2, group_size=4, minibatches=1, warmup_steps=0)
  c.rl.estimator_kwargs = {"lambda_policy": 0.95, "lambda_critic": 0.95}
  # lr 0.05: one round's fit moves the values far more than float noise.
  c.value_pretrain.update(steps=ROUNDS, tasks_per_round=2, epochs=1, minibatches=1, lr=0.05,
                          warmup_steps=0, patience=0)
  c.rollout.update(turn_budget=4, context_cap=160, env_threads=2)
  c.checkpoint.update(every=10**6, async_save=False)
  c.log.tensorboard = False
  return c


@pytest.mark.parametrize("critic", ["head", "separate"])
def test_each_rounds_readout_scores_the_critic_before_that_rounds_fit(critic, tmp_path, monkeypatch):
  """For both critics value pretraining supports (a value head, a separate
  critic): in every round the values the readout scores are the critic's
  values on that round's batch *before* the fit (recorded at the fit's start),
  and its R^2 is the readout of those values; after the fit the critic's values
  differ (so the check can tell the two apart).

  Bug caught (issue 34, checked on a scratch edit): value_pretrain.stage
  calling the readout with values scored after `pre.fit(...)` (the in-sample
  numbers early stopping would then read): the readout's values equal the
  post-fit values, not the pre-fit ones, and the comparison fails.

  Also caught (found writing this test; checked): with a value head the fit
  step donating the whole policy (`donate_argnums=(0, 1)` in
  ValuePretrainer), whose trunk arrays the sampler holds: they are deleted
  after round 0's fit (the spy's assertion fails; unchecked, the second
  round's rollouts crashed the process with a segmentation fault).
  """
  readouts, fits = [], []
  real_readout, real_fit = value_pretrain.ValuePretrainer.readout, value_pretrain.ValuePretrainer.fit

  def readout(self, sessions, pb, values_bt):
    out = real_readout(self, sessions, pb, values_bt)
    readouts.append((list(sessions), pb, np.array(values_bt), out))
    return out

  def fit(self, pb, target_bt, seed):
    before = np.asarray(self.learner.critic_values(pb))
    res = real_fit(self, pb, target_bt, seed)
    fits.append((pb, before, np.asarray(self.learner.critic_values(pb))))
    # The sampler plays the next round with the policy it holds: the fit must leave it alive.
    deleted = [x for x in jax.tree.leaves(run.sampler.params) if x.is_deleted()]
    assert not deleted, f"the fit deleted {len(deleted)} of the sampler's weight arrays"
    return res

  monkeypatch.setattr(value_pretrain.ValuePretrainer, "readout", readout)
  monkeypatch.setattr(value_pretrain.ValuePretrainer, "fit", fit)
  run = Run(_config(critic), str(tmp_path))
  run.stage_value_pretrain()
  run.ckpt.close()

  assert len(fits) == ROUNDS
  # One per round; the final readout (fresh rounds read as one set) is ValuePretrainer.final_readout,
  # tested in test_value_pretrain_final_readout.py.
  assert len(readouts) == ROUNDS
  for r, (pb, before, after) in enumerate(fits):
    sessions, r_pb, r_values, r_out = readouts[r]
    np.testing.assert_array_equal(r_pb.tokens_bt, pb.tokens_bt)  # the same round's batch
    assert np.abs(after - before).max() > 1e-3, f"round {r}: the fit did not move the values"
    np.testing.assert_allclose(r_values, before, rtol=1e-6, atol=1e-7, err_msg=f"round {r}")
    # Its numbers are the readout of those pre-fit values, not of the fitted critic's.
    want = run.learner.critic_readout(sessions, pb, before)
    assert r_out["r2"] == pytest.approx(want["r2"], abs=1e-9)
    assert r_out["explained_variance"] == pytest.approx(want["explained_variance"], abs=1e-9)
