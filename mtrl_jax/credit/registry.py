"""Estimators by name, so a sweep over credit assignment is a list of strings."""
import functools
import inspect
from typing import Callable, Dict

from mtrl_jax.credit import gae as _gae
from mtrl_jax.credit import mt_grpo as _mt_grpo
from mtrl_jax.credit import outcome as _outcome
from mtrl_jax.credit import progress as _progress
from mtrl_jax.credit import returns as _returns
from mtrl_jax.credit import step_groups as _step_groups
from mtrl_jax.credit.batch import CreditBatch

_REGISTRY: Dict[str, Callable] = {}


def register(name: str, fn: Callable) -> Callable:
  """Adds an estimator `fn(batch, **hparams) -> (adv_bt, value_target_bt)`.

  Its hyper-parameters are its keyword-only arguments, with their defaults.
  """
  if name in _REGISTRY:
    raise ValueError(f"estimator {name!r} is already registered")
  _REGISTRY[name] = fn
  return fn


def estimator_names():
  return tuple(sorted(_REGISTRY))


def hparam_defaults(name: str) -> Dict[str, object]:
  """The hyper-parameters `name` accepts, with their defaults."""
  fn = _lookup(name)
  return {p.name: p.default for p in inspect.signature(fn).parameters.values()
          if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _lookup(name: str) -> Callable:
  if name not in _REGISTRY:
    raise ValueError(f"unknown advantage estimator {name!r}; "
                     f"valid names: {', '.join(estimator_names())}")
  return _REGISTRY[name]


def _validate(name: str, hparams: Dict[str, object]) -> Callable:
  fn = _lookup(name)
  valid = hparam_defaults(name)
  unknown = sorted(set(hparams) - set(valid))
  if unknown:
    raise ValueError(f"unknown hyper-parameter(s) {unknown} for estimator {name!r}; "
                     f"valid: {sorted(valid)}")
  return fn


def compute_advantages(name: str, batch: CreditBatch, **hparams):
  """Per-token advantages (and value targets) by estimator name.

  Args:
    name: one of `estimator_names()`: 'grpo', 'ms_grpo', 'rloo',
      'return_to_go', 'gae', 'turn_gae', 'bilevel_gae', 'tree', 'gigpo',
      'hgpo', 'mt_grpo', 'progress'.
    batch: a `CreditBatch`. One row per training sample, T tokens each:
      rewards on the last action token of each turn, loss mask 1 on action
      tokens only, turn index per token, and per-row group / episode / tree
      ids (any int values; remapped inside) plus the episode return. Rows are
      whole sessions (session layout) or single turns sharing an episode id
      (per-turn layout); group statistics count each episode once. A turn's
      action tokens must sit in one row.
    **hparams: static Python values; see `hparam_defaults(name)`.

  Returns:
    (adv_bt f32[B, T], value_target_bt f32[B, T] or None). Both are exactly 0
    wherever the loss mask is 0. The value target is None for the estimators
    without a critic (all but gae, turn_gae, bilevel_gae).

  Raises:
    ValueError: unknown name or hyper-parameter (the message lists the valid
      ones), or an invalid hyper-parameter value.

  Pure jnp: call it inside jit / vmap with `name` and `hparams` as Python
  constants.
  """
  fn = _validate(name, hparams)
  return fn(batch, **hparams)


def make_advantage_fn(name: str, **hparams) -> Callable:
  """Validates once and returns `batch -> (adv_bt, value_target_bt)`."""
  fn = _validate(name, hparams)
  return functools.partial(fn, **hparams)


register("grpo", _outcome.grpo)
register("ms_grpo", _outcome.ms_grpo)
register("rloo", _outcome.rloo)
register("tree", _outcome.tree)
register("return_to_go", _returns.return_to_go)
register("gae", _gae.gae)
register("turn_gae", _gae.turn_gae)
register("bilevel_gae", _gae.bilevel_gae)
register("gigpo", _step_groups.gigpo)
register("hgpo", _step_groups.hgpo)
register("mt_grpo", _mt_grpo.mt_grpo)
register("progress", _progress.progress)
