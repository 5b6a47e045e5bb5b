"""The lab's plot: lines join across distances without significant items."""
import json
import os

from mtrl_jax.lab.credit_accuracy import plot, plot_points


def test_plot_points_skip_empty_distances_and_keep_the_rest_in_order():
  """Catches a None kept as a point (NaN: a lone entry between two empty
  distances is drawn as an unjoined dot) and points moved off their distance
  (e.g. re-indexed 0..n-1 after dropping the Nones)."""
  xs, ys = plot_points([1.0, None, 0.25, None, None, 0.5, None])
  assert xs == [0, 2, 5]
  assert ys == [1.0, 0.25, 0.5]
  assert plot_points([None, None]) == ([], [])


def test_plot_writes_a_png_from_a_result_with_empty_distances(tmp_path):
  """Catches the plot failing on a result.json as the lab writes it (None
  entries, the per-distance counts under the ticks)."""
  result = {"env": "memory", "sessions": 4, "continuations": 2, "significant_by_distance": [1, 0, 3],
            "estimators": {"gae_lambda1": {"agreement_by_distance": [1.0, None, 0.0]},
                           "ms_grpo": {"agreement_by_distance": [None, None, 0.5]}}}
  path = os.path.join(tmp_path, "agreement.png")
  plot(path, json.loads(json.dumps(result)))
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
