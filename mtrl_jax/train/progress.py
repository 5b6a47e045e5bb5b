"""Training the progress head beside the policy (SPA-RL, arXiv 2505.20732).

Before each RL update's advantages, the head takes `config.progress.steps`
full-batch AdamW steps on that update's sessions, minimising

    mean over episodes e of (sum_t c_{e,t} - R_e)^2,

c_{e,t} its share of turn t (models/progress.py), R_e the episode's return;
then its shares of the same sessions go to the `progress` estimator as
`CreditBatch.progress_bt`. The head starts as a copy of the policy's trunk
(the policy at the first RL update, i.e. after the warm start) with a zero
head. Its parameters are not in the run's checkpoint: a resumed run starts
the head again from the policy it resumes with.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mtrl_jax.models.progress import ProgressModel, turn_shares
from mtrl_jax.models.value import PolicyWithValueHead


def turn_ends(loss_mask_bt: np.ndarray, turn_idx_bt: np.ndarray) -> np.ndarray:
  """f32 [B, T]: 1 at the (target-aligned) last action token of every turn."""
  m = np.asarray(loss_mask_bt) > 0
  k = np.asarray(turn_idx_bt)
  nxt_m = np.concatenate([m[:, 1:], np.zeros_like(m[:, :1])], axis=1)
  nxt_k = np.concatenate([k[:, 1:], np.full_like(k[:, :1], -1)], axis=1)
  return (m & ~(nxt_m & (nxt_k == k))).astype(np.float32)


def progress_loss(out_bt, turn_end_bt, episode_b, return_b, valid_b):
  """(mean squared gap between an episode's summed shares and its return, shares)."""
  b = out_bt.shape[0]
  share_bt = turn_shares(out_bt, turn_end_bt)
  sum_e = jax.ops.segment_sum(jnp.sum(share_bt, axis=1), episode_b, num_segments=b)
  # Each episode once: its first row carries the return and the validity.
  rows = jnp.arange(b)
  first = jax.ops.segment_min(rows, episode_b, num_segments=b)
  present = first < b
  first = jnp.where(present, first, 0)
  ok = present & (valid_b[first] > 0)
  gap = jnp.where(ok, sum_e - return_b[first], 0.0)
  return jnp.sum(gap ** 2) / jnp.maximum(jnp.sum(ok.astype(jnp.float32)), 1.0), share_bt


class ProgressTrainer:
  """The head's parameters, optimiser and jitted step; `fit_and_share(...)` per update."""

  def __init__(self, steps: int, lr: float, *, seed: int = 0, weight_decay: float = 0.0):
    self.steps, self.seed = int(steps), int(seed)
    self.tx = optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=weight_decay)
    self.graphdef = self.params = self.opt_state = None
    self.last_loss = float("nan")

    def step(params, opt_state, tokens_bt, positions_bt, end_bt, episode_b, return_b, valid_b):
      def loss_fn(p):
        out = nnx.merge(self.graphdef, p)(tokens_bt, positions_bt)
        return progress_loss(out, end_bt, episode_b, return_b, valid_b)[0]
      loss, grads = jax.value_and_grad(loss_fn)(params)
      upd, opt_state = self.tx.update(grads, opt_state, params)
      return optax.apply_updates(params, upd), opt_state, loss

    def shares(params, tokens_bt, positions_bt, end_bt):
      return turn_shares(nnx.merge(self.graphdef, params)(tokens_bt, positions_bt), end_bt)

    def loss(params, tokens_bt, positions_bt, end_bt, episode_b, return_b, valid_b):
      out = nnx.merge(self.graphdef, params)(tokens_bt, positions_bt)
      return progress_loss(out, end_bt, episode_b, return_b, valid_b)[0]

    self._step = jax.jit(step, donate_argnums=(0, 1))
    self._shares = jax.jit(shares)
    self._loss = jax.jit(loss)

  @property
  def ready(self) -> bool:
    return self.params is not None

  def init_from_policy(self, policy_gd, policy_params) -> None:
    """Trunk copied from the policy (params of `policy_gd`, a value-head wrapper or not)."""
    policy = nnx.merge(policy_gd, policy_params)
    if isinstance(policy, PolicyWithValueHead):
      policy = policy.policy
    model = ProgressModel.from_policy(policy, rngs=nnx.Rngs(self.seed + 3))
    self.graphdef, self.params = nnx.split(model)
    self.opt_state = self.tx.init(self.params)

  def fit(self, arrays: dict, steps: int | None = None) -> float:
    """`steps` AdamW steps on one batch (dict of device arrays, see `arrays`); the last loss."""
    loss = jnp.float32(jnp.nan)
    for _ in range(self.steps if steps is None else int(steps)):
      self.params, self.opt_state, loss = self._step(
          self.params, self.opt_state, arrays["tokens_bt"], arrays["positions_bt"], arrays["end_bt"],
          arrays["episode_b"], arrays["return_b"], arrays["valid_b"])
    self.last_loss = float(loss)
    return self.last_loss

  def loss(self, arrays: dict) -> float:
    """The fit loss of the current head on a batch (no update)."""
    return float(self._loss(self.params, arrays["tokens_bt"], arrays["positions_bt"], arrays["end_bt"],
                            arrays["episode_b"], arrays["return_b"], arrays["valid_b"]))

  def fit_early_stopping(self, train: dict, held_out: dict, max_steps: int, every: int = 10,
                         patience: int = 3) -> dict:
    """Steps on `train` in chunks of `every`, keeping the parameters with the lowest loss
    on `held_out`; stops after `patience` chunks without improvement. (A head fitted to
    a fixed set of sessions memorises their returns, luck included, within ~100 steps.)"""
    best = (self.loss(held_out), 0, jax.tree.map(jnp.copy, self.params))
    since, done = 0, 0
    while done < max_steps and since < patience:
      self.fit(train, min(every, max_steps - done))
      done += min(every, max_steps - done)
      val = self.loss(held_out)
      if val < best[0]:
        best, since = (val, done, jax.tree.map(jnp.copy, self.params)), 0
      else:
        since += 1
    self.params = best[2]
    return {"held_out_loss": best[0], "best_step": best[1], "steps_run": done,
            "train_loss": self.loss(train)}

  def shares(self, arrays: dict) -> np.ndarray:
    return np.asarray(self._shares(self.params, arrays["tokens_bt"], arrays["positions_bt"], arrays["end_bt"]))


def arrays(pb) -> dict:
  """The host arrays of a `PackedBatch` that the head trains and reads on."""
  return dict(tokens_bt=pb.tokens_bt, positions_bt=pb.positions_bt,
              end_bt=turn_ends(pb.loss_mask_bt, pb.turn_idx_bt), episode_b=pb.episode_id_b,
              return_b=pb.return_b, valid_b=pb.sample_valid_b)
