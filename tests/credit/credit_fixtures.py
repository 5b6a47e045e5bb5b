"""Shared helpers of the credit tests (imported by name; tests/credit is on
sys.path under pytest's default import mode): random rollout batches in the
session layout, their per-turn re-packing, and cached jitted estimators."""
import functools

import jax
import numpy as np
from hypothesis import strategies as st

from mtrl_jax.credit import compute_advantages, make_credit_batch

ESTIMATORS = ("grpo", "ms_grpo", "rloo", "tree", "return_to_go", "gae", "turn_gae",
              "bilevel_gae", "gigpo", "hgpo", "mt_grpo", "progress")
B, T = 6, 12  # fixed shapes: one compile per estimator across all examples


def random_sessions(seed: int, b: int = B, t: int = T, n_groups: int = 2,
                    pad_row: bool = False) -> dict:
  """Numpy arrays of a session-layout batch with random turns and rewards.

  Each row: optional prompt tokens, then turns of (observation tokens,
  action tokens >= 1); the reward sits on the turn's last action token;
  padding after the last turn. Ids are deliberately sparse, not 0..B-1.
  The per-turn fields of the newer estimators come from a second generator
  (the first one's stream, and so every older test's data, is unchanged):
  an anchor state id per turn from {-1 (none), 3, 40, 41} (sparse, often
  shared), and a turn reward and a progress share on each turn's last
  action token.
  """
  rng = np.random.default_rng(seed)
  reward = np.zeros((b, t), np.float32)
  mask = np.zeros((b, t), np.float32)
  turn = np.zeros((b, t), np.int32)
  for i in range(b):
    if pad_row and i == b - 1:
      turn[i] = rng.integers(0, 3, size=t)  # garbage, masked anyway
      break
    pos, k = int(rng.integers(0, 3)), 0
    while True:
      obs = int(rng.integers(0 if k == 0 else 1, 3))
      act = int(rng.integers(1, 4))
      if pos + obs + act > t:
        break
      turn[i, pos:pos + obs + act] = k
      mask[i, pos + obs:pos + obs + act] = 1
      reward[i, pos + obs + act - 1] = float(rng.integers(-2, 3))
      pos, k = pos + obs + act, k + 1
    turn[i, pos:] = max(k - 1, 0)
    if k == 0:  # guarantee at least one turn
      mask[i, t - 1] = 1
      reward[i, t - 1] = float(rng.integers(-2, 3))
      turn[i, :] = 0
  value = rng.normal(size=(b, t)).astype(np.float32)
  group = rng.integers(0, n_groups, size=b) * 7 + 3
  tree = rng.integers(0, 3, size=b) * 5 + 11
  ret = (reward * mask).sum(1)
  extra = np.random.default_rng([seed, 1])
  state = np.full((b, t), -1, np.int32)
  turn_reward = np.zeros((b, t), np.float32)
  share = np.zeros((b, t), np.float32)
  for i in range(b):
    m = mask[i] > 0
    for k in np.unique(turn[i][m]):
      toks = np.flatnonzero(turn[i] == k)
      state[i, toks] = extra.choice([-1, 3, 40, 41])
      last = np.flatnonzero(m & (turn[i] == k))[-1]
      turn_reward[i, last] = float(extra.integers(0, 2))
      share[i, last] = float(extra.normal())
  return dict(reward_bt=reward, loss_mask_bt=mask, turn_idx_bt=turn, group_id_b=group,
              episode_id_b=np.arange(b) * 13 + 2, tree_id_b=tree, return_b=ret,
              value_bt=value, state_id_bt=state, turn_reward_bt=turn_reward, progress_bt=share)


def split_per_turn(d: dict, seed: int = 0, pad_rows_to=None):
  """Re-packs session rows into one row per turn (history context).

  A turn's row keeps the whole transcript but masks every other turn's
  action tokens; rewards of other turns stay in the row (they must be
  ignored because their mask is 0). Rows are shuffled, then padding rows
  (no action token, fresh episode ids) fill up to `pad_rows_to`. Returns
  (arrays, origin) with origin[j] = (session row, turn index) of new row j,
  None for padding rows.
  """
  rows, origin = [], []
  for i in range(d["reward_bt"].shape[0]):
    m = d["loss_mask_bt"][i] > 0
    turns = sorted(set(d["turn_idx_bt"][i][m].tolist())) or [None]
    for k in turns:
      keep = m & (d["turn_idx_bt"][i] == k) if k is not None else m
      rows.append((i, keep))
      origin.append((i, k))
  perm = np.random.default_rng(seed).permutation(len(rows))
  rows = [rows[p] for p in perm]
  origin = [origin[p] for p in perm]
  out = {}
  for key, val in d.items():
    out[key] = np.stack([val[i] for i, _ in rows])
  out["loss_mask_bt"] = np.stack([keep.astype(np.float32) for _, keep in rows])
  if pad_rows_to is not None:
    extra = pad_rows_to - len(rows)
    assert extra >= 0, (pad_rows_to, len(rows))
    for key, val in out.items():
      filler = np.zeros((extra,) + val.shape[1:], val.dtype)
      if key == "episode_id_b":
        filler = np.arange(extra) + 10_000
      elif key == "group_id_b":
        filler = np.full(extra, val[0])
      elif key == "return_b":
        filler = np.full(extra, 99.0, np.float32)  # must not enter any statistic
      out[key] = np.concatenate([val, filler])
    origin = origin + [None] * extra
  return out, origin


def to_batch(d: dict):
  return make_credit_batch(**d)


@functools.lru_cache(maxsize=None)
def jitted(name: str, items: tuple = ()):
  """compute_advantages(name, ., **dict(items)) under jit, cached."""
  hp = dict(items)
  return jax.jit(lambda batch: compute_advantages(name, batch, **hp))


seeds = st.integers(0, 2**31 - 1)


@functools.lru_cache(maxsize=None)
def _traced(name: str, static_items: tuple):
  static = dict(static_items)
  return jax.jit(lambda batch, floats: compute_advantages(name, batch, **floats, **static))


def run_traced(name: str, batch, floats: dict, **static):
  """Like `run`, but the float hyper-parameters in `floats` are traced, so
  new values reuse the compiled function."""
  floats = {k: np.float32(v) for k, v in floats.items()}
  return _traced(name, tuple(sorted(static.items())))(batch, floats)


def run(name: str, batch, **hparams):
  """Jitted compute_advantages with hashable hyper-parameters (cached)."""
  return jitted(name, tuple(sorted(hparams.items())))(batch)
