"""The stopping rule inside value pretraining's stage: a target ratio stops *before* that round's fit
(the critic handed to RL is the one the readout scored), and the stage says why it stopped."""
import pytest

from mtrl_jax.train import value_pretrain
from mtrl_jax.train.run import Run

from test_user_env_critic_bar import _config  # a user's env, a tiny model (registered there)

OWN_RATIOS = [0.2, 0.5, 0.9]  # scripted per round: the critic's EV over the oracle's


@pytest.fixture(scope="module")
def record(tmp_path_factory):
  fits = []
  c = _config()
  c.stages = ("value_pretrain",)
  c.value_pretrain.update(steps=10, patience=0, stop_at_bar=False, stop_at_ratio=0.45, readout_tasks=0)
  with pytest.MonkeyPatch.context() as mp:
    real_readout, real_fit = value_pretrain.ValuePretrainer.readout, value_pretrain.ValuePretrainer.fit

    def readout(self, sessions, pb, values_bt):
      out = real_readout(self, sessions, pb, values_bt)
      k = min(len(fits), len(OWN_RATIOS) - 1)
      return {**out, "explained_variance": OWN_RATIOS[k] * 0.5, "oracle_explained_variance": 0.5}

    def fit(self, pb, target_bt, seed):
      fits.append(seed)
      return real_fit(self, pb, target_bt, seed)

    mp.setattr(value_pretrain.ValuePretrainer, "readout", readout)
    mp.setattr(value_pretrain.ValuePretrainer, "fit", fit)
    run = Run(c, str(tmp_path_factory.mktemp("ratio")))
    out = run.stage_value_pretrain()
    run.ckpt.close()
  return {"out": out, "fits": fits, "meta": run.meta}


def test_target_ratio_stops_before_the_rounds_fit(record):
  """Round 0 (ratio 0.2) is fitted; round 1 reads 0.5 >= 0.45 and stops unfitted: one fit, one
  round's critic steps, reason 'ratio'. Break checked: the stage fitting before it decides (the
  old order): two fits and 2 critic steps."""
  out = record["out"]
  assert record["fits"] == [0]
  assert out["value_pretrain/stopped_at_ratio"] == 1.0
  assert (out["value_pretrain/rounds"], out["value_pretrain/critic_steps"]) == (2, 1)
  assert [r[-1] for r in record["meta"]["vp_records"]] == pytest.approx([0.2, 0.5])
