"""The early-exit split of the lab's scores, and the per-turn-normalisation
bias it is there to measure, on a tabular `cashout` whose A* is exact."""
import numpy as np
import pytest

from mtrl_jax.credit import compute_advantages, make_credit_batch
from mtrl_jax.lab.credit_accuracy import split_scores


def test_split_scores_hand_example():
  """Stops (items 0, 1) and carry-ons (2, 3, 4) scored apart; insignificant
  items (item 4: |A*| < 2 se) left out of the agreement, not of the bias.
  Break checked: the two masks swapped, or the agreement counting
  insignificant items, fails."""
  a_star = np.array([-1.0, -0.5, 0.5, 0.5, 0.01])
  se = np.array([0.1, 0.1, 0.1, 0.1, 0.1])
  est = np.array([1.0, -2.0, 1.0, -1.0, 3.0])
  out = split_scores(est, a_star, se, np.array([True, True, False, False, False]))
  assert out["agreement_exit"] == 0.5 and out["significant_exit"] == 2
  assert out["agreement_carry_on"] == 0.5 and out["significant_carry_on"] == 2
  rms_e, rms_a = np.sqrt(np.mean(est ** 2)), np.sqrt(np.mean(a_star ** 2))
  assert out["bias_exit"] == pytest.approx(np.mean(est[:2] / rms_e - a_star[:2] / rms_a))
  assert out["mean_estimate_carry_on"] == pytest.approx(np.mean(est[2:] / rms_e))
  none = split_scores(est, a_star, se, np.zeros(5, bool))
  assert none["agreement_exit"] is None and none["bias_exit"] is None


def tabular_cashout(length=8, stop_p=0.1, cash=0.3, p_pay=0.9, tasks=64, group=4, seed=0):
  """Sessions of `cashout` under a policy that stops with probability stop_p at
  every turn offering it, with the exact A* (the payoff draw is shared by a
  task's group, as in the env): V_t = stop_p cash + (1 - stop_p) V_{t+1},
  V_length = the draw; A*(stop at t) = cash - V_t, A*(carry on) = V_{t+1} - V_t.
  Returns (CreditBatch, per-item A*, per-item is-stop, per-item token index)."""
  rng = np.random.default_rng(seed)
  t_max = length + 1
  rows, a_star, stop, grp = [], [], [], []
  for task in range(tasks):
    paid = float(rng.random() < p_pay)
    v = np.zeros(length + 1)
    v[length] = paid
    for t in range(length - 1, -1, -1):
      v[t] = stop_p * cash + (1 - stop_p) * v[t + 1]
    for _ in range(group):
      rew = []
      for t in range(length):
        if rng.random() < stop_p:
          rew.append(cash)
          a_star.append(cash - v[t])
          stop.append(True)
          break
        rew.append(0.0)
        a_star.append(v[t + 1] - v[t])
        stop.append(False)
      else:
        rew.append(paid)
        a_star.append(0.0)
        stop.append(False)
      rows.append(rew)
      grp.append(task)
  b = len(rows)
  reward = np.zeros((b, 2 * t_max), np.float32)
  mask = np.zeros((b, 2 * t_max), np.float32)
  turn = np.zeros((b, 2 * t_max), np.int32)
  idx = []
  for i, r in enumerate(rows):
    for t, x in enumerate(r):
      mask[i, 2 * t + 1], reward[i, 2 * t + 1] = 1.0, x
      turn[i, 2 * t:2 * t + 2] = t
      idx.append((i, 2 * t + 1))
    turn[i, 2 * len(r):] = len(r) - 1
  state = turn.copy()  # the state of a running session is its turn
  batch = make_credit_batch(reward, mask, turn, group_id_b=np.array(grp), state_id_bt=state)
  return batch, np.array(a_star), np.array(stop), idx


def _agreement(name, hp, batch, a_star, stop, idx):
  adv = np.asarray(compute_advantages(name, batch, **hp)[0])
  est = np.array([adv[i, j] for i, j in idx])
  sig = np.abs(a_star) > 1e-6
  m = stop & sig
  return float(np.mean(np.sign(est[m]) == np.sign(a_star[m]))), float(np.mean(est[stop]))


def test_normalising_rewards_per_turn_then_summing_credits_stopping():
  """With exact A* on a tabular cashout (carrying on is right in 90% of the
  tasks), the per-turn MT-GRPO port (normalise each turn's reward over the
  sessions still running at that index, then sum to the end; verl #7244)
  gives most stops the wrong sign and a positive mean: the payoff at the last
  index is compared only with sessions that also carried on, so it cancels,
  while the cash of a stop is compared with the carry-ons' 0. Summing first
  and normalising once per turn index (return_to_go) agrees on most stops,
  and padding the ended sessions with 0 removes most of the bias.
  Break checked: mt_grpo's 'normalise_then_sum' computed as
  'sum_then_normalise' (the bug being measured disappears) fails the first
  assertion."""
  batch, a_star, stop, idx = tabular_cashout()
  assert stop.sum() > 60 and np.mean(a_star[stop] < 0) > 0.8
  port = dict(turn_signal="reward", turn_credit="normalise_then_sum", outcome_weight=0.0)
  agree_port, mean_port = _agreement("mt_grpo", port, batch, a_star, stop, idx)
  agree_rtg, _ = _agreement("return_to_go", {}, batch, a_star, stop, idx)
  agree_pad, _ = _agreement("mt_grpo", {**port, "pad_finished": True}, batch, a_star, stop, idx)
  print(f"stop agreement: per-turn port {agree_port:.2f} (mean {mean_port:+.2f}), "
        f"return_to_go {agree_rtg:.2f}, padded port {agree_pad:.2f}")
  assert agree_port < 0.3 and mean_port > 0
  assert agree_rtg > agree_port + 0.4
  assert agree_pad > agree_port
