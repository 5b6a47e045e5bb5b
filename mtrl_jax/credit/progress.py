"""Learned progress (SPA-RL, arXiv 2505.20732): per-step shares as step rewards.

A progress head (a model outside credit/, trained so that the shares of an
episode's turns add up to its return) gives every turn a share c_{i,t}; it
arrives here as `CreditBatch.progress_bt`, on the turn's last action token.
SPA turns the share (plus a grounding signal for actions the env accepted)
into a dense step reward and runs any advantage estimator over those; here
the estimator is return-to-go over them.
"""
from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.credit.returns import RTG_NORMS, return_to_go


def progress(batch: CreditBatch, *, gamma: float = 1.0, grounding_coef: float = 0.0,
             norm: str = "group_turn", eps: float = 1e-6, scale_by_std: bool = True, ddof: int = 0,
             max_turns=None):
  """Return-to-go over the step rewards r'_{i,t} = c_{i,t} + grounding_coef * u_{i,t}.

  c: the progress head's share of turn t (`progress_bt`); u: the env's
  turn reward (`turn_reward_bt`, e.g. 1 for a valid action: SPA's
  grounding signal; zeros when absent). The env's own rewards are not
  added: the shares were fitted to add up to the return already.
  A_{i,t} = norm(G'_{i,t}), G'_{i,t} = sum_{k >= t} gamma^(k-t) r'_{i,k}, with
  `norm` as in return_to_go ('group_turn': the sessions of the group that
  have turn t). If the shares are the turns' true contributions
  (c_t = r_t + V(h_{t+1}) - V(h_t), which add up to R - V(h_0)), gamma = 1
  gives G'_t = (return from t) - V(h_t) for t >= 1: a Monte-Carlo
  advantage; gamma = 0 gives the share itself.

  Raises ValueError if the batch has no `progress_bt`.
  """
  if batch.progress_bt is None:
    raise ValueError("the progress estimator needs CreditBatch.progress_bt (per-turn shares of a "
                     "trained progress head); the learner fills it when rl.estimator='progress'")
  if norm not in RTG_NORMS:
    raise ValueError(f"norm must be one of {RTG_NORMS}, got {norm!r}")
  shaped = batch.progress_bt
  if batch.turn_reward_bt is not None:  # (grounding_coef may be traced: no Python test of its value)
    shaped = shaped + grounding_coef * batch.turn_reward_bt
  return return_to_go(batch._replace(reward_bt=shaped), gamma=gamma, norm=norm, eps=eps,
                      scale_by_std=scale_by_std, ddof=ddof, max_turns=max_turns)
