"""The study's critic bar on the lab's critic rows (lab/critic_bar.py, credit_accuracy.mark_critic_rows)."""
import numpy as np
import pytest

from mtrl_jax.lab import critic_bar
from mtrl_jax.lab.credit_accuracy import mark_critic_rows, plot, table_lines


@pytest.mark.parametrize("quality,bar,interval,verdict", [
    # the interval decides, as report.cell_critic: lower end >= 0.8 yes, upper end < 0.8 no, else uncertain
    ({"explained_variance": 0.5, "oracle_explained_variance": 0.6, "ev_over_oracle_lo": 0.81,
      "ev_over_oracle_hi": 0.9}, "yes", True, None),
    ({"explained_variance": 0.5, "oracle_explained_variance": 0.6, "ev_over_oracle_lo": 0.5,
      "ev_over_oracle_hi": 0.79}, "no", True, critic_bar.BELOW),
    # point ratio 0.83 above the bar, but the interval straddles it: uncertain, not yes
    ({"explained_variance": 0.5, "oracle_explained_variance": 0.6, "ev_over_oracle_lo": 0.7,
      "ev_over_oracle_hi": 0.95}, "uncertain", True, "critic uncertain"),
    # ends missing (a degenerate bootstrap): the point ratio 0.47 / 0.60 = 0.78 decides
    ({"explained_variance": 0.47, "oracle_explained_variance": 0.60, "ev_over_oracle_lo": None,
      "ev_over_oracle_hi": None}, "no", False, critic_bar.BELOW),
    ({"explained_variance": 0.59, "oracle_explained_variance": 0.60}, "yes", False, None),
    # the oracle explains nothing (the lab's memory run: -0.13): no ratio, not tested
    ({"explained_variance": -0.002, "oracle_explained_variance": -0.13}, None, False, "not tested"),
    # no oracle on this env: not judged, and not called untested
    ({"explained_variance": 0.3}, None, False, "no oracle"),
])
def test_judge(quality, bar, interval, verdict):
  """Catches the bar judged on the point ratio when an interval exists (the straddling case reads
  'yes'), the ends swapped (lower end < bar read as 'no'), a ratio to an oracle EV <= 0 (-0.002 /
  -0.13 = 0.015 would read 'no' for the wrong reason), and a missing oracle called below the bar."""
  j = critic_bar.judge(quality)
  assert j["bar"] == bar and j["interval"] is interval
  if verdict is None:
    assert j["verdict"] is None
  else:
    assert verdict in j["verdict"]
  assert (j["verdict"] == critic_bar.BELOW) == (bar == "no")
  assert j["tested"] is (None if "no oracle" in (verdict or "") else bar in ("yes", "uncertain"))


def _result():
  row = lambda f, ci: {"agreement": {"agreement": f, "items": 4, "agree": int(4 * f), "wilson95": ci},  # noqa: E731
                       "agreement_by_distance": [f, None], "agreement_by_distance_items": [4, 0],
                       "agreement_by_distance_wilson95": [ci, None], "rank_corr": 0.1, "bias": 0.0,
                       "variance": 0.0}
  return {"env": "bifurcation", "sessions": 4, "continuations": 2, "significant_by_distance": [4, 0],
          "estimators": {"gae_lambda1": row(0.75, [0.3, 0.95]), "gae_lambda0.95": row(0.5, [0.15, 0.85]),
                         "ms_grpo": row(0.25, [0.05, 0.7])}}


def test_critic_rows_carry_their_critics_bar_and_the_table_says_it(tmp_path):
  """`mc` is below the bar (interval [0.5, 0.7]), `coupled` passes ([0.85, 1.1]), ms_grpo reads no
  critic. Catches the verdict put on the wrong critic's rows (e.g. every critic row judged by 'mc'),
  on a critic-free row, or missing from the printed table's row label; the plot must draw a result
  with bars and verdicts."""
  table = {"gae_lambda1": ("gae", {}, "mc"), "gae_lambda0.95": ("gae", {}, "coupled"),
           "ms_grpo": ("ms_grpo", {}, None)}
  critics = {"mc": {"explained_variance": 0.3, "oracle_explained_variance": 0.5, "ev_over_oracle_lo": 0.5,
                    "ev_over_oracle_hi": 0.7, "explained_variance_lo": 0.2, "explained_variance_hi": 0.4},
             "coupled": {"explained_variance": 0.48, "oracle_explained_variance": 0.5, "ev_over_oracle_lo": 0.85,
                         "ev_over_oracle_hi": 1.1}}
  result = _result()
  mark_critic_rows(result, table, critics)
  result["critics"] = critics
  rows = result["estimators"]
  assert rows["gae_lambda1"]["critic"] == "mc" and rows["gae_lambda1"]["verdict"] == critic_bar.BELOW
  assert rows["gae_lambda0.95"]["critic"] == "coupled" and rows["gae_lambda0.95"]["verdict"] is None
  assert rows["gae_lambda0.95"]["critic_bar"]["bar"] == "yes"
  assert "critic" not in rows["ms_grpo"] and "verdict" not in rows["ms_grpo"]
  assert critics["mc"]["critic_bar"]["bar"] == "no"
  lines = table_lines(result)
  by_name = {ln.split(" | ")[0][2:]: ln for ln in lines[2:]}
  assert set(by_name) == {f"gae_lambda1 ({critic_bar.BELOW})", "gae_lambda0.95", "ms_grpo"}
  assert "0.60 [0.50, 0.70] no" in by_name[f"gae_lambda1 ({critic_bar.BELOW})"]
  assert "0.300 [0.20, 0.40]" in by_name[f"gae_lambda1 ({critic_bar.BELOW})"]
  assert "0.96 [0.85, 1.10] yes" in by_name["gae_lambda0.95"]
  assert lines[0].startswith("| estimator | all (n=4) | d=0 (n=4) | d=1 (n=0) |")
  assert "| 0.75 [0.30, 0.95] | 0.75 [0.30, 0.95] | - |" in by_name[f"gae_lambda1 ({critic_bar.BELOW})"]
  plot(str(tmp_path / "agreement.png"), result)
  assert (tmp_path / "agreement.png").read_bytes()[:4] == b"\x89PNG"


def test_the_ratios_interval_reaches_the_bar_from_the_readout():
  """End to end through critic_readout.ev_intervals: on 400 sessions a critic that is the oracle plus
  per-token noise (sd 0.35; ratio 0.11, interval about [-0.04, 0.25]) is below the bar; the oracle
  itself passes (ratio 1). Catches judge() reading other keys than the ones ev_intervals writes."""
  from mtrl_jax.train.critic_readout import ev_intervals
  rng = np.random.default_rng(0)
  b, t = 400, 6
  oracle = np.repeat(rng.choice([0.2, 0.9], size=(b, 1)), t, axis=1)
  target = oracle + rng.normal(0, 0.3, (b, 1))
  mask = np.ones((b, t))
  noisy = oracle + rng.normal(0, 0.35, (b, t))
  quality = lambda values: {"explained_variance": 1 - np.var(target - values) / np.var(target),  # noqa: E731
                            "oracle_explained_variance": 1 - np.var(target - oracle) / np.var(target),
                            **ev_intervals(values, target, mask, oracle, boot=500)}
  below, fit = critic_bar.judge(quality(noisy)), critic_bar.judge(quality(oracle))
  assert (below["bar"], below["interval"], fit["bar"], fit["interval"]) == ("no", True, "yes", True)
  assert below["ratio_hi"] == quality(noisy)["ev_over_oracle_hi"] < 0.8
