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

An env that declares no decision (a user's own env) still gets an oracle: the
*empirical* one, each token's expected return-to-go given its task (the group:
sessions of a group play one task), its turn and the session's turn-0 action
text, estimated from the batch (`task_oracle_values`, `oracle_task_keyed` = 1
in the readout). A task's group is small (4 sessions in the study), so a
cross-fitted mean (from the group's other sessions) would be a noisy
predictor whose own noise counts against it: with 2 sessions in a cell its
residual variance doubles and the oracle's EV drops, which makes the bar easy
to pass. Instead each cell's in-sample residuals are scaled by
sqrt(W / (W - sum w^2 / W)) (w: a session's tokens in the cell, W their sum):
the residual sum of squares is then an unbiased estimate of the true value's,
the way an n - 1 divisor makes a sample variance unbiased. A cell with one
session says nothing about its spread: its tokens get a residual the size of
the other cells' pooled spread at that turn (`task_oracle_values`). It is the best
value of (task, first action) only: where later replies matter too (a format
penalty), a critic can beat it (ratio > 1). It needs groups of two sessions or
more (`rl.group_size`); with one, it knows only the turn.

And at the decision itself (`decision_error`, `decision_gap`, where the env
has a decision): the critic's mean |V - V_oracle| on the turn-0 action tokens
that follow the decision, and its value gap between the two choices beside
the oracle's. An "arm-blind" critic has a gap of ~0 whatever its EV.

Intervals (`ev_intervals`, `readout(..., boot=N)`): 95% percentile-bootstrap
intervals of the critic's EV, the oracle's EV and their ratio, resampling
sessions (rows), not tokens: a session's tokens share its return, so a
token bootstrap would treat hundreds of copies of one outcome as independent
and give intervals far too narrow. Each draw resamples the same rows for all
three numbers (the ratio's interval is that of one paired estimate). EV is a
function of a few sums over tokens, so each row is reduced to its sufficient
statistics once and a draw is a vector of resample counts times them: 2,000
draws over 1,000 sessions is one [2000, 1000] x [1000, 7] product.

Token keys. The critic's value at a target-aligned position is computed from
the tokens before it, so the first action token of turn 0 has not seen the
decision (key (0, "?")); the later tokens of turn 0 and every token of a
later turn k have (key (k, decision)). MC targets are constant within a turn
(the turn's reward sits on its last token), so these keys are exact.

Pure numpy over host arrays; the caller passes the env's decision function.
"""
from __future__ import annotations

import math
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


# Columns of `session_stats`: per row, the token count and the sums of t, t^2, d, d^2 for the
# critic's residual d = t - v and the oracle's e = t - o.
_N, _T, _TT, _D, _DD, _E, _EE = range(7)


def session_stats(values_bt, target_bt, mask_bt, oracle_bt=None) -> np.ndarray:
  """f64[S, 7]: the sufficient statistics of each row with at least one mask-1 token (see `_N`...).

  Targets and residuals are centred on their overall means first: EV is shift-invariant, and
  sums of squares of centred values lose no precision to cancellation when variances are taken.
  Without `oracle_bt` its columns are 0.
  """
  m = np.asarray(mask_bt) > 0
  t = np.asarray(target_bt, np.float64)
  v = np.asarray(values_bt, np.float64)
  o = np.zeros_like(t) if oracle_bt is None else np.asarray(oracle_bt, np.float64)
  rows = m.any(axis=1)
  m, t, v, o = m[rows], t[rows], v[rows], o[rows]
  if not m.any():
    return np.zeros((0, 7))
  d, e = t - v, t - o
  t, d, e = (np.where(m, x - x[m].mean(), 0.0) for x in (t, d, e))
  return np.stack([m.sum(1), t.sum(1), (t * t).sum(1), d.sum(1), (d * d).sum(1), e.sum(1), (e * e).sum(1)],
                  axis=1).astype(np.float64)


def evs_from_stats(sums) -> tuple[np.ndarray, np.ndarray]:
  """(critic EV, oracle EV) from summed statistics [..., 7]; NaN where the targets' variance is ~0
  or fewer than two tokens (a degenerate draw: dropped from the percentiles)."""
  s = np.asarray(sums, np.float64)
  n = s[..., _N]
  with np.errstate(divide="ignore", invalid="ignore"):
    var = lambda a, aa: aa / n - (a / n) ** 2  # noqa: E731
    var_t = var(s[..., _T], s[..., _TT])
    ok = (n >= 2) & (var_t > 1e-12)
    ev = np.where(ok, 1.0 - var(s[..., _D], s[..., _DD]) / var_t, np.nan)
    oracle = np.where(ok, 1.0 - var(s[..., _E], s[..., _EE]) / var_t, np.nan)
  return ev, oracle


def resample_counts(n_rows: int, boot: int, seed: int) -> np.ndarray:
  """int[boot, n_rows]: how often each row is drawn in each of `boot` resamples of n_rows rows."""
  if n_rows == 0:
    return np.zeros((boot, 0), np.int64)
  # Indices drawn uniformly and counted with one bincount: the same law as a multinomial draw,
  # ~8x faster than Generator.multinomial at [2000, 1000] (0.02 s vs 0.18 s, measured).
  idx = np.random.default_rng(seed).integers(0, n_rows, (boot, n_rows))
  flat = (np.arange(boot)[:, None] * n_rows + idx).ravel()
  return np.bincount(flat, minlength=boot * n_rows).reshape(boot, n_rows)


def ev_intervals(values_bt, target_bt, mask_bt, oracle_bt=None, *, boot: int = 2000, level: float = 0.95,
                 seed: int = 0, cluster_b=None) -> dict:
  """Session-bootstrap intervals of the critic's EV, the oracle's and their ratio (module doc).

  Returns explained_variance_lo/_hi, readout_sessions (rows with a mask-1 token) and, with
  `oracle_bt`, oracle_explained_variance_lo/_hi and ev_over_oracle_lo/_hi. A draw whose oracle
  EV is <= 0 (to rounding: 1e-9) has no ratio (the bar "EV >= 0.8 x the oracle's" means nothing
  there): it is left out of the ratio's percentiles, and with most draws so the ratio's ends are NaN.

  `cluster_b` (an id per row, e.g. the group): resample whole clusters instead of rows, for sessions
  that share hidden draws (a task's group). The oracle's values are taken as given: a cross-fitted
  oracle's own estimation noise (`memory`) is not in its interval; a closed-form one has none.
  """
  stats = session_stats(values_bt, target_bt, mask_bt, oracle_bt)
  sessions = len(stats)
  if cluster_b is not None:
    ids = np.asarray(cluster_b)[(np.asarray(mask_bt) > 0).any(axis=1)]
    _, which = np.unique(ids, return_inverse=True)
    stats = np.stack([np.bincount(which, weights=col) for col in stats.T], axis=1) if len(stats) else stats
  sums = resample_counts(len(stats), boot, seed).astype(np.float64) @ stats
  ev_b, or_b = evs_from_stats(sums)
  q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]

  def ends(x):
    x = x[np.isfinite(x)]
    return (float("nan"),) * 2 if x.size < boot / 2 else tuple(float(y) for y in np.percentile(x, q))

  out = {"readout_sessions": int(sessions)}
  out["explained_variance_lo"], out["explained_variance_hi"] = ends(ev_b)
  if oracle_bt is not None:
    out["oracle_explained_variance_lo"], out["oracle_explained_variance_hi"] = ends(or_b)
    with np.errstate(divide="ignore", invalid="ignore"):
      # 1e-9, not 0: a draw of one session repeated has oracle EV 0 up to rounding (~1e-16), whose ratio
      # would be ~1e16 of either sign
      ratio_b = np.where(or_b > 1e-9, ev_b / or_b, np.nan)
    out["ev_over_oracle_lo"], out["ev_over_oracle_hi"] = ends(ratio_b)
  return out


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


def task_oracle_values(turn_idx_bt, target_bt, mask_bt, group_b, first_actions_b) -> np.ndarray:
  """f32[B, T]: the empirical oracle of an env without a declared decision (see the module doc).

  A token's cell is (group, turn, turn-0 action), turn 0's first action token keyed '?' (undecided)
  as in `token_keys`. In a cell of two sessions (rows) or more the token takes t - (t - mean) * f,
  with the cell's token-weighted mean and f = sqrt(W / (W - sum w^2 / W)): its residual is the
  in-sample one, scaled so the cell's residual sum of squares is unbiased for that of the true
  conditional mean. A token alone in its cell gets a residual of the size the other cells at its
  turn have (the square root of their pooled, unbiased within-cell variance; turn 0's undecided
  cells pooled apart from its decided ones), signed as it sits
  against its group's mean at that turn; where its turn has no such cell, the residual against the
  turn's mean over the whole batch, scaled the same way (an oracle that knows only the turn).
  """
  t = np.asarray(target_bt, np.float64)
  m = np.asarray(mask_bt) > 0
  group = np.asarray(group_b)
  keys = token_keys(turn_idx_bt, m, first_actions_b)
  levels = (lambda b, k: (group[b], k[0], k[1]), lambda b, k: (group[b], k[0]), lambda b, k: (k[0],))
  cells = [dict() for _ in levels]  # per level: cell -> {row: its token positions in the cell}
  for b, p in zip(*np.nonzero(m)):
    for lev, key_of in enumerate(levels):
      cells[lev].setdefault(key_of(b, keys[b, p]), {}).setdefault(b, []).append(p)

  def fit(rows):  # (weighted mean, unbiasing factor or None, residual SS, its expectation / sigma^2)
    w = np.array([len(ps) for ps in rows.values()], np.float64)
    big_w = w.sum()
    mean = float(np.sum([t[b, ps].sum() for b, ps in rows.items()])) / big_w
    d = big_w - float((w * w).sum()) / big_w
    ss = float(np.sum([((t[b, ps] - mean) ** 2).sum() for b, ps in rows.items()]))
    return mean, (math.sqrt(big_w / d) if len(rows) >= 2 and d > 1e-12 else None), ss, d

  fits = [{cell: fit(rows) for cell, rows in level.items()} for level in cells]
  # (turn, decided?) -> [sum of residual SS, sum of their expectations / sigma^2] over level-0 cells
  # (turn 0's undecided cells hold every action: their spread is not a decided cell's)
  pooled: dict = {}
  for (_, turn, action), (_, f, ss, d) in fits[0].items():
    if f is not None:
      acc = pooled.setdefault((turn, action == UNDECIDED), [0.0, 0.0])
      acc[0] += ss
      acc[1] += d
  out = np.zeros(t.shape, np.float64)
  overall = float(t[m].mean()) if m.any() else 0.0
  for b, p in zip(*np.nonzero(m)):
    k = keys[b, p]
    mean, f, _, _ = fits[0][levels[0](b, k)]
    if f is not None:
      out[b, p] = t[b, p] - (t[b, p] - mean) * f
    elif pooled.get((k[0], k[1] == UNDECIDED), (0.0, 0.0))[1] > 0:
      ss, d = pooled[(k[0], k[1] == UNDECIDED)]
      size = math.sqrt(ss / d)
      out[b, p] = t[b, p] - math.copysign(size, t[b, p] - fits[1][levels[1](b, k)][0])
    else:
      mean, f, _, _ = fits[2][levels[2](b, k)]
      out[b, p] = t[b, p] - (t[b, p] - mean) * f if f is not None else overall
  return out.astype(np.float32)


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
            group_b: Sequence[int], decision_fn: Optional[Callable[..., Optional[str]]],
            value_fn: Optional[Callable[[int, str], Optional[float]]] = None, boot: int = 0,
            seed: int = 0, first_observations_b: Optional[Sequence[Optional[str]]] = None) -> dict:
  """The critic's fit and the oracle's beside it (module doc).

  Args:
    values_bt, target_bt, mask_bt, turn_idx_bt: host arrays of one batch
      (target-aligned, as in rollout/packing.py); targets are MC return-to-go.
    first_actions_b: each row's session's turn-0 action text (None: padding row).
    group_b: each row's group id (the oracle's folds are group parities; the empirical oracle's
      cells are groups).
    decision_fn: the env's `first_decision`, or None (the empirical oracle, keyed by group and
      turn-0 action; module doc).
    value_fn: the env's `decision_value` (closed-form oracle), or None.
    boot: > 0: add `ev_intervals` with this many session resamples (seeded by `seed`).
    first_observations_b: each row's session's turn-0 observation; given, `decision_fn` is called as
      decision_fn(action, observation) (registry.first_decision_fn's signature).

  Returns keys explained_variance, r2, oracle_explained_variance, oracle_r2 and, with a decision
  function, decision_error, decision_gap, oracle_decision_gap (without one, oracle_task_keyed = 1);
  with `boot`, the intervals' keys and readout_sessions.
  """
  return readout_and_oracle(values_bt, target_bt, mask_bt, turn_idx_bt, first_actions_b=first_actions_b,
                            group_b=group_b, decision_fn=decision_fn, value_fn=value_fn, boot=boot, seed=seed,
                            first_observations_b=first_observations_b)[0]


def readout_and_oracle(values_bt, target_bt, mask_bt, turn_idx_bt, *, first_actions_b, group_b, decision_fn,
                       value_fn=None, boot: int = 0, seed: int = 0,
                       first_observations_b=None) -> tuple[dict, np.ndarray]:
  """`readout`'s dict and the oracle's values [B, T] it scored (value pretraining pools them)."""
  out = fit_scores(values_bt, target_bt, mask_bt)
  if decision_fn is None:  # the empirical oracle (module doc): sessions of a task share it, so
    # the intervals resample whole groups
    oracle = task_oracle_values(turn_idx_bt, target_bt, mask_bt, group_b, first_actions_b)
    o = fit_scores(oracle, target_bt, mask_bt)
    out.update(oracle_explained_variance=o["explained_variance"], oracle_r2=o["r2"], oracle_task_keyed=1.0)
    if boot:
      out.update(ev_intervals(values_bt, target_bt, mask_bt, oracle, boot=boot, seed=seed, cluster_b=group_b))
    return out, oracle
  if first_observations_b is None:
    decisions = [None if a is None else decision_fn(a) for a in first_actions_b]
  else:  # an env whose decision reads what turn 0 showed (Env.first_decision)
    decisions = [None if a is None else decision_fn(a, o) for a, o in zip(first_actions_b, first_observations_b)]
  keys = token_keys(turn_idx_bt, mask_bt, decisions)
  oracle = oracle_values(keys, target_bt, np.asarray(group_b) % 2, value_fn, decisions)
  o = fit_scores(oracle, target_bt, mask_bt)
  out.update(oracle_explained_variance=o["explained_variance"], oracle_r2=o["r2"])
  out.update(_decision_stats(values_bt, oracle, keys))
  if boot:
    out.update(ev_intervals(values_bt, target_bt, mask_bt, oracle, boot=boot, seed=seed))
  return out, oracle


def first_turns(sessions: Sequence, session_index_b) -> tuple[list, list]:
  """Each row's session's turn-0 action and observation (None, None on a padding row): the readout's
  decision (Env.first_decision) reads both."""
  turns = [sessions[i].turns[0] if i >= 0 and sessions[i].turns else None for i in session_index_b]
  return [t and t.action for t in turns], [t and t.observation for t in turns]


def batch_readout(sessions: Sequence, pb, values_bt, mc_bt, *, decision_fn=None, value_fn=None, boot: int = 0,
                  seed: int = 0, with_oracle: bool = False):
  """`readout` on a packed batch (rollout/packing.PackedBatch) of `sessions`: each row's turn-0 action
  and observation read from its session, MC targets `mc_bt`. `with_oracle`: (readout, oracle values)."""
  first, seen = first_turns(sessions, pb.session_index_b)
  out, oracle = readout_and_oracle(values_bt, mc_bt, pb.loss_mask_bt, pb.turn_idx_bt, first_actions_b=first,
                                   group_b=pb.group_id_b, decision_fn=decision_fn, value_fn=value_fn, boot=boot,
                                   seed=seed, first_observations_b=seen)
  return (out, oracle) if with_oracle else out


def explained_variance(v, t, m) -> float:
  """1 - Var[t - v] / Var[t] over the tokens of mask m (0 with fewer than 2 tokens or constant targets)."""
  m = np.asarray(m) > 0
  if m.sum() < 2:
    return 0.0
  var_t = np.var(t[m])
  return float(1.0 - np.var(t[m] - v[m]) / var_t) if var_t > 1e-12 else 0.0


def update_readout(sessions: Sequence, pb, values_bt, target_bt, mc_bt, *, decision_fn=None, value_fn=None) -> dict:
  """An update's held-out view of its critic: the values scored before the update's epochs against the
  estimator's targets (value/explained_variance_before) and, as `readout`, against MC returns beside
  the oracle's (value/...)."""
  values_bt = np.asarray(values_bt)
  out = {"value/explained_variance_before": explained_variance(values_bt, np.asarray(target_bt), pb.loss_mask_bt)}
  out.update({f"value/{k}": v for k, v in batch_readout(sessions, pb, values_bt, np.asarray(mc_bt),
                                                       decision_fn=decision_fn, value_fn=value_fn).items()})
  return out
