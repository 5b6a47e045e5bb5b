"""The one jitted, sharded, donated RL update step (policy and critic).

`LearnerState` holds both networks' parameters and optimiser states. The step
computes the policy loss (any `credit.losses.policy_loss` option) and the
clipped value loss, applies both optimisers, and refuses non-finite updates:
when the loss or a gradient norm is not finite the old state is kept and the
step reports `nonfinite=1`, so the host can count and stop.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mtrl_jax.compile.programs import Program, Tree
from mtrl_jax.credit.diagnostics import per_turn_mean_std
from mtrl_jax.credit.losses import PolicyLossConfig, policy_loss, value_loss
from mtrl_jax.models.logprobs import TokenStats, token_stats
from mtrl_jax.models.value import PolicyWithValueHead, with_policy_trunk
from mtrl_jax.parallel.batch import put_global_batch
from mtrl_jax.parallel.sharded_step import join_trainable, sharding_context, split_trainable
from mtrl_jax.rollout.packing import PackedBatch
from mtrl_jax.rollout.row_packing import RowPlan, pack_rows


class LearnerState(NamedTuple):
  policy: Any  # nnx.State of the policy's Params (with a value head when critic.kind='head')
  opt_policy: Any
  critic: Any  # nnx.State of a separate critic's Params, or {} when there is none
  opt_critic: Any


class RLBatch(NamedTuple):
  """One minibatch on device; target-aligned per-token fields (see rollout.packing)."""
  tokens_bt: jax.Array
  targets_bt: jax.Array
  positions_bt: jax.Array
  loss_mask_bt: jax.Array
  behav_logp_bt: jax.Array
  prox_logp_bt: jax.Array
  ref_logp_bt: jax.Array
  adv_bt: jax.Array
  value_target_bt: jax.Array
  old_value_bt: jax.Array
  turn_idx_bt: jax.Array
  success_bt: jax.Array  # the success (0/1) of each token's session
  # With several sessions per row (config.rl.pack): the session of each token
  # within its row (1, 2, ...; 0 on padding). None = one session per row.
  segment_ids_bt: Optional[jax.Array] = None


class StepFlags(NamedTuple):
  """Per-call scalars (replicated): which parts train, and a test hook."""
  train_policy: jax.Array  # 1.0, or 0.0 during critic warm-up / value pretraining
  train_critic: jax.Array
  poison: jax.Array  # test hook: the loss is scaled by (1 + poison); NaN makes loss AND gradients NaN


def _segments(segment_ids_bt) -> dict:
  # No keyword at all when rows hold one session: the model call (and its
  # compiled program) is then exactly the unpacked one.
  return {} if segment_ids_bt is None else {"segment_ids_bt": segment_ids_bt}


def forward(graphdef, params, tokens_bt, targets_bt, positions_bt,
            segment_ids_bt=None) -> tuple[TokenStats, Any]:
  """(per-token TokenStats of the targets, values or None) of a policy that may carry a value head.

  The vocabulary logits are reduced to log-probs / entropy in chunks of
  `cfg.logits_chunk` positions (models/logprobs.py): [B, T, V] never exists whole.
  """
  model = nnx.merge(graphdef, params)
  seg = _segments(segment_ids_bt)
  if isinstance(model, PolicyWithValueHead):
    h, _ = model.policy.hidden(tokens_bt, positions_bt=positions_bt, **seg)
    return token_stats(model.policy, h, targets_bt), model.value_head(h)
  h, _ = model.hidden(tokens_bt, positions_bt=positions_bt, **seg)
  return token_stats(model, h, targets_bt), None


def critic_values(graphdef, params, tokens_bt, positions_bt, segment_ids_bt=None):
  return nnx.merge(graphdef, params)(tokens_bt, positions_bt=positions_bt, **_segments(segment_ids_bt))


def _keep_if(ok, new, old):
  return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


class Frozen(NamedTuple):
  """The parts of the policy / critic state no optimiser moves (LoRA: the base), or None.

  The step reads them but neither differentiates, donates nor returns them:
  their arrays stay the caller's, unchanged, from update to update.
  """
  policy: Any = None
  critic: Any = None


def split_state(state: LearnerState, policy_trainable=None, critic_trainable=None) -> tuple[LearnerState, Frozen]:
  """(the trainable parts with their optimiser states, the frozen parts) of a learner state.

  `*_trainable`: an nnx filter of what trains (LoRA: the adapters and a value head), None: all.
  """
  p_t, p_f = split_trainable(state.policy, policy_trainable)
  c_t, c_f = split_trainable(state.critic, critic_trainable)
  return LearnerState(p_t, state.opt_policy, c_t, state.opt_critic), Frozen(p_f, c_f)


def join_state(train: LearnerState, frozen: Frozen) -> LearnerState:
  """The inverse of `split_state`."""
  return LearnerState(join_trainable(train.policy, frozen.policy), train.opt_policy,
                      join_trainable(train.critic, frozen.critic), train.opt_critic)


def make_rl_step(policy_gd, critic_gd, tx_policy: optax.GradientTransformation,
                 tx_critic: Optional[optax.GradientTransformation], loss_cfg: PolicyLossConfig, *,
                 value_coef: float, value_clip: Optional[float], decoupled: bool,
                 shared_trunk: bool = False) -> Callable:
  """Returns the pure step fn(state, batch, flags, frozen=Frozen()) -> (state, metrics); jit it
  with shardings, donating `state` only.

  `state.policy` / `state.critic` hold what the optimisers update and
  `frozen` the rest of each network (None: nothing is frozen): with LoRA
  adapters, the adapters (and a value head) train and the base is frozen, so
  optimiser states and gradients cover the adapters only. `shared_trunk`: the
  critic state is a shared-trunk critic's own part and its trunk is the
  policy's (critic.kind="lora").
  """
  head = critic_gd is None and tx_critic is None

  def loss_fn(params, batch: RLBatch, flags: StepFlags):
    p_params, c_params = params
    seg = batch.segment_ids_bt
    stats, head_values = forward(policy_gd, p_params, batch.tokens_bt, batch.targets_bt,
                                 batch.positions_bt, seg)
    p_loss, diag = policy_loss(
        loss_cfg, stats.logp_bt, batch.behav_logp_bt, batch.adv_bt, batch.loss_mask_bt,
        prox_logp_bt=batch.prox_logp_bt if decoupled else None,
        ref_logp_bt=batch.ref_logp_bt if loss_cfg.kl_coef else None,
        entropy_bt=stats.entropy_bt, turn_idx_bt=batch.turn_idx_bt, success_b=batch.success_bt,
        segment_ids_bt=seg)
    ent_mean_k, _, _ = per_turn_mean_std(jax.lax.stop_gradient(stats.entropy_bt),
                                         batch.turn_idx_bt, batch.loss_mask_bt, loss_cfg.max_turns)
    diag["entropy_by_turn"] = ent_mean_k
    if head_values is not None:
      values = head_values
    elif c_params is not None and critic_gd is not None:
      if shared_trunk:
        c_params = with_policy_trunk(c_params, p_params)
      values = critic_values(critic_gd, c_params, batch.tokens_bt, batch.positions_bt, seg)
    else:
      values = None
    total = flags.train_policy * p_loss
    if values is not None:
      v_loss, v_diag = value_loss(values, batch.old_value_bt, batch.value_target_bt,
                                  batch.loss_mask_bt, clip_eps=value_clip)
      diag.update(v_diag)
      total = total + value_coef * flags.train_critic * v_loss
    # Multiplied in (not added) so that NaN reaches every gradient, not only the loss.
    total = total * (1.0 + flags.poison)
    return total, diag

  def step(state: LearnerState, batch: RLBatch, flags: StepFlags, frozen: Frozen = Frozen()):
    has_critic = critic_gd is not None
    p_train, c_train = state.policy, (state.critic if has_critic else None)

    def loss_of_trainable(trainable, batch, flags):
      pt, ct = trainable
      full = (join_trainable(pt, frozen.policy), join_trainable(ct, frozen.critic) if has_critic else None)
      return loss_fn(full, batch, flags)

    (loss, diag), (g_p, g_c) = jax.value_and_grad(loss_of_trainable, has_aux=True)(
        (p_train, c_train), batch, flags)
    gn_p = optax.global_norm(g_p)
    gn_c = optax.global_norm(g_c) if has_critic else jnp.zeros(())
    ok = jnp.isfinite(loss) & jnp.isfinite(gn_p) & jnp.isfinite(gn_c)
    upd, opt_p = tx_policy.update(g_p, state.opt_policy, p_train)
    new_p = optax.apply_updates(p_train, upd)
    # A head critic lives in the policy params: it must move even while the
    # policy is frozen (value pretraining, critic warm-up).
    move_p = ok & ((flags.train_policy > 0) | (head & (flags.train_critic > 0)))
    if head:
      new_p, opt_p = _mask_head_update(p_train, new_p, opt_p, flags)
    policy = _keep_if(move_p, new_p, p_train)
    opt_policy = _keep_if(move_p, opt_p, state.opt_policy)
    critic, opt_critic = state.critic, state.opt_critic
    if has_critic:
      upd_c, opt_c = tx_critic.update(g_c, state.opt_critic, c_train)
      new_c = optax.apply_updates(c_train, upd_c)
      move_c = ok & (flags.train_critic > 0)
      critic = _keep_if(move_c, new_c, c_train)
      opt_critic = _keep_if(move_c, opt_c, state.opt_critic)
    metrics = {**diag, "total_loss": loss, "grad_norm_policy": gn_p, "grad_norm_critic": gn_c,
               "nonfinite": (~ok).astype(jnp.float32)}
    return LearnerState(policy, opt_policy, critic, opt_critic), metrics

  return step


def _mask_head_update(old_p, new_p, opt_p, flags):
  """With a shared trunk and the policy frozen, only the value head may change."""
  frozen = flags.train_policy <= 0

  def pick(path, n, o):
    is_head = any(getattr(k, "key", None) == "value_head" for k in path)
    return n if is_head else jnp.where(frozen, o, n)

  return jax.tree_util.tree_map_with_path(pick, new_p, old_p), opt_p


def make_values_fn(policy_gd, critic_gd, *, shared_trunk: bool = False) -> Callable:
  """fn(policy, critic, tokens, positions) -> values: the critic alone (no log-probs, no LM head).
  With `shared_trunk` (critic.kind='lora') the critic's adapters sit on the policy's frozen trunk."""

  def values(p_params, c_params, tokens_bt, positions_bt):
    if critic_gd is not None:
      if shared_trunk:
        c_params = with_policy_trunk(c_params, p_params)
      return critic_values(critic_gd, c_params, tokens_bt, positions_bt)
    model = nnx.merge(policy_gd, p_params)
    h, _ = model.policy.hidden(tokens_bt, positions_bt=positions_bt)
    return model.value_head(h)

  return values


def make_score_fn(policy_gd, critic_gd, ref_gd=None, *, policy_trainable=None,
                  shared_trunk: bool = False) -> Callable:
  """fn(policy, critic, ref, tokens, targets, positions, segment_ids=None) -> (logp, ref_logp, values).

  The learner's proximal log-probs (decoupled PPO), the reference log-probs
  (KL) and the critic's values, all computed once before the update epochs.
  With `policy_trainable` (LoRA) the reference holds only that part of the
  policy (its adapters): the frozen rest is the policy's own.
  """

  def score(p_params, c_params, ref_params, tokens_bt, targets_bt, positions_bt, segment_ids_bt=None):
    stats, head_v = forward(policy_gd, p_params, tokens_bt, targets_bt, positions_bt, segment_ids_bt)
    logp = stats.logp_bt
    ref_logp = jnp.zeros_like(logp)
    if ref_params is not None:
      ref_full = join_trainable(ref_params, split_trainable(p_params, policy_trainable)[1])
      ref_stats, _ = forward(ref_gd if ref_gd is not None else policy_gd, ref_full, tokens_bt,
                             targets_bt, positions_bt, segment_ids_bt)
      ref_logp = ref_stats.logp_bt
    if head_v is not None:
      values = head_v
    elif critic_gd is not None:
      if shared_trunk:
        c_params = with_policy_trunk(c_params, p_params)
      values = critic_values(critic_gd, c_params, tokens_bt, positions_bt, segment_ids_bt)
    else:
      values = jnp.zeros_like(logp)
    return logp, ref_logp, values

  return score


# ------------------------------------------------------------------ the host side of an update
def rl_batch(pb: PackedBatch, plan: Optional[RowPlan], scored, credit, *, pad_id: int) -> RLBatch:
  """The update's per-token fields ([B, T] host arrays) in the layout the step trains on.

  `scored`: train/scoring.Scored; `credit`: train/credit_step.Credit. With a row plan, several
  samples per row (segment ids kept).
  """
  per_token = dict(
      tokens_bt=pb.tokens_bt, targets_bt=pb.targets_bt, positions_bt=pb.positions_bt,
      loss_mask_bt=pb.loss_mask_bt, behav_logp_bt=pb.behav_logp_bt,
      prox_logp_bt=np.asarray(scored.prox_logp_bt), ref_logp_bt=np.asarray(scored.ref_logp_bt),
      adv_bt=np.asarray(credit.adv_bt), value_target_bt=np.asarray(credit.target_bt),
      old_value_bt=np.asarray(scored.values_bt), turn_idx_bt=pb.turn_idx_bt,
      success_bt=np.broadcast_to(pb.success_b[:, None], pb.tokens_bt.shape).copy())
  if plan is None:
    return RLBatch(**per_token)
  packed = {k: pack_rows(v, plan, pad_id if k in ("tokens_bt", "targets_bt") else 0) for k, v in per_token.items()}
  return RLBatch(**packed, segment_ids_bt=plan.segment_ids_rl)


def keep_rows(batch: RLBatch, draw) -> RLBatch:
  """Only the rows of `draw` (credit_step.AAWDraw): the drawn ones, then filler rows that carry no loss."""
  out = jax.tree.map(lambda x: np.asarray(x)[draw.rows], batch)
  mask = np.array(out.loss_mask_bt)
  mask[draw.trained:] = 0.0  # filler rows: shapes only, no loss
  return out._replace(loss_mask_bt=mask)


class Epochs(NamedTuple):
  """What `run_epochs` did: the learner state after it, the steps' mean metrics, how many steps were refused."""
  state: LearnerState
  metrics: dict
  nonfinite: float


def run_epochs(step_fn: Callable, state: LearnerState, batch: RLBatch, flags: StepFlags, *, trainable=(None, None),
               epochs: int, minibatches: int, rng: np.random.Generator, mesh, rules) -> Epochs:
  """`epochs` passes over `batch` in `minibatches` shuffled minibatches, one donated step each.

  Only the trainable parts of `state` (`trainable`: the policy's and critic's filters, see
  `split_state`) go through the steps; the frozen parts are read, never donated. Each
  minibatch goes to the devices as a global batch (every host holds the whole batch and
  feeds its own devices' rows). A step with a non-finite loss or gradient keeps the state
  and reports `nonfinite` = 1 (counted here).
  """
  train, frozen = split_state(state, *trainable)
  b = batch.tokens_bt.shape[0]
  mb = b // minibatches
  out = []
  with sharding_context(mesh, rules):
    for _ in range(epochs):
      perm = rng.permutation(b)
      for m in range(minibatches):
        idx = perm[m * mb:(m + 1) * mb]
        part = put_global_batch(jax.tree.map(lambda x: np.asarray(x)[idx], batch), mesh, rules)
        train, met = step_fn(train, part, flags, frozen)
        out.append(met)
  host = jax.device_get(out)
  return Epochs(join_state(train, frozen), mean_metrics(host), sum(float(m["nonfinite"]) for m in host))


def mean_metrics(ms: list) -> dict:
  """The steps' metrics averaged; a per-turn vector metric k becomes k/0, k/1, ..."""
  out = {}
  for k in ms[0]:
    vals = [np.asarray(m[k]) for m in ms]
    if vals[0].ndim == 0:
      out[k] = float(np.mean(vals))
    else:
      arr = np.mean(np.stack(vals), axis=0)
      for i, v in enumerate(arr):
        out[f"{k}/{i}"] = float(v)
  return out


# ------------------------------------------------------------------ the learner's shared programs
# Each spec's fields are all its build reads: the key of the program every learner of this process
# with an equal spec shares (mtrl_jax/compile/programs.py). `tx_*` are one object per recipe
# (train/optim.py); `replicated` is the mesh's replicated sharding.
@dataclasses.dataclass(frozen=True)
class RLStepProgram(Program):
  """make_rl_step jitted: trainable state in `train_shardings` (donated), frozen parts in `frozen_shardings`."""
  policy_gd: Any
  critic_gd: Any
  tx_policy: Any
  tx_critic: Any
  loss_cfg: PolicyLossConfig
  value_coef: float
  value_clip: Optional[float]
  decoupled: bool
  shared_trunk: bool
  train_shardings: Tree
  frozen_shardings: Tree
  replicated: Any

  def build(self):
    train_sh, frozen_sh, rep = self.train_shardings.value, self.frozen_shardings.value, self.replicated
    step = make_rl_step(self.policy_gd, self.critic_gd, self.tx_policy, self.tx_critic, self.loss_cfg,
                        value_coef=self.value_coef, value_clip=self.value_clip, decoupled=self.decoupled,
                        shared_trunk=self.shared_trunk)
    return jax.jit(step, in_shardings=(train_sh, None, rep, frozen_sh), out_shardings=(train_sh, rep),
                   donate_argnums=(0,))


@dataclasses.dataclass(frozen=True)
class ScoreProgram(Program):
  """make_score_fn jitted; replicated outputs: every host reads the whole batch's scores."""
  policy_gd: Any
  critic_gd: Any
  policy_trainable: Any
  shared_trunk: bool
  replicated: Any

  def build(self):
    return jax.jit(make_score_fn(self.policy_gd, self.critic_gd, policy_trainable=self.policy_trainable,
                                 shared_trunk=self.shared_trunk), out_shardings=self.replicated)


@dataclasses.dataclass(frozen=True)
class ValuesProgram(Program):
  """make_values_fn jitted (the critic alone), replicated outputs."""
  policy_gd: Any
  critic_gd: Any
  shared_trunk: bool
  replicated: Any

  def build(self):
    return jax.jit(make_values_fn(self.policy_gd, self.critic_gd, shared_trunk=self.shared_trunk),
                   out_shardings=self.replicated)
