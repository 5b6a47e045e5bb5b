"""How good is the critic? Held-out fit, and an oracle critic to compare it with.

Explained variance alone cannot tell a useless critic from a good one on a
noisy probe: on `bifurcation` the reward noise caps what any critic can
explain (the closed-form values score EV 0.3-0.5), and any constant scores 0.
So every readout here puts three numbers side by side, all on the same tokens
and the same Monte-Carlo (gamma 1, lambda 1) return-to-go targets:

* `explained_variance`: 1 - Var[t - V] / Var[t] (insensitive to a constant offset);
* `r2`: 1 - mean((t - V)^2) / Var[t], the skill over the best constant
  predictor (the targets' mean scores 0; a zero-initialised head scores
  below 0 when the returns are not centred). Early stopping uses it: fitting
  the mean is progress, which EV cannot see;
* the same two for an *oracle critic* on probes that declare their decisive
  choice (`Env.first_decision`, e.g. `bifurcation`'s arm, `memory`'s peek):
  the expected return-to-go given the token's turn and the turn-0 decision.
  That is the best value any critic can have when the decision is all that
  matters for the future return. Where the env knows it in closed form
  (`Env.decision_value`: `bifurcation`'s payoffs 0.95 / 0.30) it is exact;
  otherwise (`memory`, whose payoff depends on the policy's recall) it is the
  mean return-to-go of the sessions sharing the key, cross-fitted (means from
  the other half of the groups, so it is not flattered by the batch it is
  scored on; with few groups it is noisy, and can score below 0).

And at the decision itself (`decision_error`, `decision_gap`, where the env
has a decision): the critic's mean |V - V_oracle| on the turn-0 action tokens
that follow the decision, and its value gap between the two choices beside
the oracle's. An "arm-blind" critic has a gap of ~0 whatever its EV.

Token keys. The critic's value at a target-aligned position is computed from
the tokens before it, so the first action token of turn 0 has not seen the
decision (key (0, "?")); the later tokens of turn 0 and every token of a
later turn k have (key (k, decision)). MC targets are constant within a turn
(the turn's reward sits on its last token), so these keys are exact.

Pure numpy over host arrays; the caller passes the env's decision function.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

UNDECIDED = "?"


def fit_scores(values_bt, target_bt, mask_bt) -> dict:
  """{'explained_variance', 'r2'} of `values_bt` against `target_bt` on mask-1 tokens.

  Both are 0 when fewer than two tokens or constant targets.
  """
  m = np.asarray(mask_bt) > 0
  if m.sum() < 2:
    return {"explained_variance": 0.0, "r2": 0.0}
  t = np.asarray(target_bt, np.float64)[m]
  v = np.asarray(values_bt, np.float64)[m]
  var_t = np.var(t)
  if var_t <= 1e-12:
    return {"explained_variance": 0.0, "r2": 0.0}
  return {"explained_variance": float(1.0 - np.var(t - v) / var_t),
          "r2": float(1.0 - np.mean((t - v) ** 2) / var_t)}


def token_keys(turn_idx_bt, mask_bt, decision_b: Sequence[Optional[str]]) -> np.ndarray:
  """object[B, T]: (turn, decision) per mask-1 token (None elsewhere); see the module doc."""
  turn = np.asarray(turn_idx_bt)
  m = np.asarray(mask_bt) > 0
  keys = np.full(turn.shape, None, dtype=object)
  for b in range(turn.shape[0]):
    pos = np.nonzero(m[b])[0]
    first0 = next((p for p in pos if turn[b, p] == 0), None)
    for p in pos:
      d = UNDECIDED if p == first0 else decision_b[b]
      keys[b, p] = (int(turn[b, p]), d)
  return keys


def oracle_values(keys_bt, target_bt, fold_b, value_fn=None, decision_b=None) -> np.ndarray:
  """f32[B, T]: each token's oracle value (see the module doc).

  With `value_fn(turn, decision)` (an env's closed form, e.g. `bifurcation`'s
  arm payoffs) a decided token takes that value exactly, and an undecided
  one (turn 0's first action token) the closed-form values averaged over the
  decisions the other fold's sessions took. Otherwise (or where `value_fn`
  returns None) each token takes the mean target of the other fold's tokens
  with its key; a key the other fold lacks falls back to the other fold's
  mean at that turn, then to its overall mean. `fold_b` (0/1 per row) splits
  the batch; with one fold only (a single group) the means are in-sample.
  """
  keys = np.array(keys_bt, dtype=object)  # a copy: decided tokens are blanked below
  t = np.asarray(target_bt, np.float64)
  fold = np.asarray(fold_b)
  folds = sorted(set(fold.tolist()))
  out = np.zeros(t.shape, np.float32)
  for f in folds:
    src = [g for g in folds if g != f] or [f]
    rows = np.nonzero(np.isin(fold, src))[0]
    taken = [decision_b[b] for b in rows if decision_b is not None and decision_b[b] is not None]

    def closed(k):
      if value_fn is None or k is None:
        return None
      if k[1] != UNDECIDED:
        return value_fn(k[0], k[1])
      vals = [value_fn(k[0], d) for d in taken]
      return None if not vals or any(v is None for v in vals) else float(np.mean(vals))

    for b in np.nonzero(fold == f)[0]:
      for p in range(t.shape[1]):
        v = closed(keys[b, p])
        if v is not None:
          out[b, p] = v
          keys[b, p] = None  # done: the empirical pass below skips it
  for f in folds:
    src = [g for g in folds if g != f] or [f]
    by_key: dict = {}
    by_turn: dict = {}
    all_t = []
    for b in np.nonzero(np.isin(fold, src))[0]:
      for p in range(t.shape[1]):
        k = keys[b, p]
        if k is None:
          continue
        by_key.setdefault(k, []).append(t[b, p])
        by_turn.setdefault(k[0], []).append(t[b, p])
        all_t.append(t[b, p])
    overall = float(np.mean(all_t)) if all_t else 0.0
    for b in np.nonzero(fold == f)[0]:
      for p in range(t.shape[1]):
        k = keys[b, p]
        if k is None:
          continue
        pool = by_key.get(k) or by_turn.get(k[0])
        out[b, p] = float(np.mean(pool)) if pool else overall
  return out


def _decision_stats(values_bt, oracle_bt, keys_bt) -> dict:
  """Critic vs oracle on the turn-0 tokens after the decision (see the module doc)."""
  keys = np.asarray(keys_bt, dtype=object)
  sel = np.vectorize(lambda k: k is not None and k[0] == 0 and k[1] not in (UNDECIDED, None),
                     otypes=[bool])(keys)
  if not sel.any():
    return {}
  v, o = np.asarray(values_bt, np.float64), np.asarray(oracle_bt, np.float64)
  out = {"decision_error": float(np.mean(np.abs(v[sel] - o[sel])))}
  choices = sorted({k[1] for k in keys[sel]})
  if len(choices) == 2:
    a, b = choices
    ia = sel & np.vectorize(lambda k: k is not None and k[1] == a, otypes=[bool])(keys)
    ib = sel & ~ia
    out["decision_gap"] = float(np.mean(v[ia]) - np.mean(v[ib]))
    out["oracle_decision_gap"] = float(np.mean(o[ia]) - np.mean(o[ib]))
  return out


def readout(values_bt, target_bt, mask_bt, turn_idx_bt, *, first_actions_b: Sequence[Optional[str]],
            group_b: Sequence[int], decision_fn: Optional[Callable[[str], Optional[str]]],
            value_fn: Optional[Callable[[int, str], Optional[float]]] = None) -> dict:
  """The critic's fit and, if `decision_fn` is given, the oracle's beside it (module doc).

  Args:
    values_bt, target_bt, mask_bt, turn_idx_bt: host arrays of one batch
      (target-aligned, as in rollout/packing.py); targets are MC return-to-go.
    first_actions_b: each row's session's turn-0 action text (None: padding row).
    group_b: each row's group id (the oracle's folds are group parities).
    decision_fn: the env's `first_decision`, or None.
    value_fn: the env's `decision_value` (closed-form oracle), or None.

  Returns keys explained_variance, r2 and, with a decision function,
  oracle_explained_variance, oracle_r2, decision_error, decision_gap,
  oracle_decision_gap.
  """
  out = fit_scores(values_bt, target_bt, mask_bt)
  if decision_fn is None:
    return out
  decisions = [None if a is None else decision_fn(a) for a in first_actions_b]
  keys = token_keys(turn_idx_bt, mask_bt, decisions)
  oracle = oracle_values(keys, target_bt, np.asarray(group_b) % 2, value_fn, decisions)
  o = fit_scores(oracle, target_bt, mask_bt)
  out.update(oracle_explained_variance=o["explained_variance"], oracle_r2=o["r2"])
  out.update(_decision_stats(values_bt, oracle, keys))
  return out
