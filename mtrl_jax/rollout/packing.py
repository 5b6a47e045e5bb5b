"""Packing sessions into padded, bucketed numpy arrays for a jitted step.

Shift convention (what makes `token_logprobs` line up):

    logits_btv = model(tokens_bt)
    logp_bt    = token_logprobs(logits_btv, targets_bt)

`tokens_bt[b, :n]` is the sample's token sequence and `targets_bt[b, i] =
tokens_bt[b, i + 1]` (pad after the last token), so `logp_bt[b, i]` is the
log-prob of token i + 1 computed from the logits at position i. Every per-token
training field (`loss_mask_bt`, `behav_logp_bt`, `version_bt`, `reward_bt`,
`turn_idx_bt`) describes the TARGET token at that position; `positions_bt`
describes the input token (its RoPE position).

Layouts:
  * `session`: one row per session, all turns, loss on every action token.
  * `turn`: one row per turn; `context="history"` keeps all earlier turns in
    front (loss only on the current action), `context="markov"` keeps only the
    prompt head and the current observation (needs the tokenizer to rebuild
    `observation_ids(obs_t, prompt)` for t > 0). The engine samples with
    the full history in the cache, so under "markov" the behaviour log-probs
    were computed in a different context than the one trained on.

Ids for the credit library (`group_id_b`, `tree_id_b`, `episode_id_b`) are
remapped to dense ranks in [0, B); padding rows each get fresh ids of their
own and all-zero masks. The env's anchor state keys (`Turn.info["state_key"]`)
become `state_id_bt`: one id per distinct key in the batch (the same key,
the same id; -1 where the env gave none), on every token of the turn. A
turn's `invalid_action` (the env called its reply malformed or illegal)
becomes `invalid_bt`, True on every token of that turn, so the credit step
can tell which turns' replies were valid (the graded control draws only
sessions whose decision reply was).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from mtrl_jax.rollout.session import Session

LAYOUTS = ("session", "turn")
CONTEXTS = ("history", "markov")


class PackedBatch(NamedTuple):
  """A batch of training samples; B rows (samples) by T token positions.

  Per-token fields are described in the module docstring (target-aligned
  except `tokens_bt` and `positions_bt`); `turn_reward_bt` holds each turn's
  `info["turn_reward"]` where `reward_bt` holds its reward, `state_id_bt` the
  id of its anchor state key, `invalid_bt` (bool) whether its turn's reply was
  invalid (`Turn.invalid_action`; False on padding). Per-sample fields:
    group_id_b / tree_id_b / episode_id_b: int32 dense ids in [0, B).
    return_b: f32 the session's return; success_b: f32 0/1.
    num_turns_b: int32 turns in the session.
    sample_valid_b: f32 1 on real samples, 0 on padding rows.
    session_index_b: int32 index into the packed session list (-1 padding).
    sample_turn_b: int32 the turn a `turn`-layout row trains (-1 otherwise).
    length_b: int32 real tokens in the row (input side).
  """
  tokens_bt: np.ndarray
  targets_bt: np.ndarray
  loss_mask_bt: np.ndarray
  behav_logp_bt: np.ndarray
  version_bt: np.ndarray
  reward_bt: np.ndarray
  turn_idx_bt: np.ndarray
  positions_bt: np.ndarray
  group_id_b: np.ndarray
  tree_id_b: np.ndarray
  episode_id_b: np.ndarray
  return_b: np.ndarray
  success_b: np.ndarray
  num_turns_b: np.ndarray
  sample_valid_b: np.ndarray
  session_index_b: np.ndarray
  sample_turn_b: np.ndarray
  length_b: np.ndarray
  state_id_bt: np.ndarray | None = None
  turn_reward_bt: np.ndarray | None = None
  invalid_bt: np.ndarray | None = None  # pack_sessions always fills it; None only in hand-built batches

  @property
  def shape(self) -> tuple[int, int]:
    return self.tokens_bt.shape


class _Sample(NamedTuple):
  """One row before padding (input-aligned per-token arrays of length n)."""
  session_index: int
  turn: int
  tokens: np.ndarray
  mask: np.ndarray
  logp: np.ndarray
  version: np.ndarray
  reward: np.ndarray
  turn_idx: np.ndarray
  state_id: np.ndarray
  turn_reward: np.ndarray
  invalid: np.ndarray  # bool: the token's turn's reply was invalid


def bucket_length(n: int, length_buckets: Sequence[int] | None = None, min_length: int = 16) -> int:
  """Smallest bucket >= n: from `length_buckets` if given, else a power of two >= min_length."""
  if length_buckets:
    fits = [b for b in sorted(length_buckets) if b >= n]
    if not fits:
      raise ValueError(f"a sample of {n} tokens exceeds the largest of length_buckets={list(length_buckets)}")
    return int(fits[0])
  size = max(int(min_length), 1)
  while size < n:
    size *= 2
  return size


def _flat_state_ids(s: Session, key_ids: dict) -> np.ndarray:
  """int32 [L]: the id of each token's turn's anchor state key (-1: none)."""
  ids = [-1 if k is None else key_ids.setdefault(k, len(key_ids)) for k in s.state_keys()]
  parts = [np.full(t.num_tokens, x, np.int32) for t, x in zip(s.turns, ids)]
  return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


def _flat_invalid(s: Session) -> np.ndarray:
  """bool [L]: each token's turn's `invalid_action`."""
  parts = [np.full(t.num_tokens, bool(t.invalid_action)) for t in s.turns]
  return np.concatenate(parts) if parts else np.zeros((0,), bool)


def _session_sample(i: int, s: Session, key_ids: dict) -> _Sample:
  return _Sample(i, -1, s.flat_tokens(), s.loss_mask(), s.flat_logp(), s.flat_version(),
                 s.flat_reward(), s.flat_turn_idx(), _flat_state_ids(s, key_ids), s.flat_turn_reward(),
                 _flat_invalid(s))


def _turn_samples(i: int, s: Session, context: str, tokenizer, key_ids: dict) -> list[_Sample]:
  out = []
  tokens, mask, logp = s.flat_tokens(), s.loss_mask(), s.flat_logp()
  version, reward, turn_idx = s.flat_version(), s.flat_reward(), s.flat_turn_idx()
  state_id, turn_reward, invalid = _flat_state_ids(s, key_ids), s.flat_turn_reward(), _flat_invalid(s)
  start = 0
  for k, t in enumerate(s.turns):
    end = start + t.num_tokens
    if context == "history":
      keep = turn_idx[:end] == k  # earlier turns stay as context with mask 0
      out.append(_Sample(i, k, tokens[:end], np.where(keep, mask[:end], 0.0).astype(np.float32),
                         np.where(keep, logp[:end], 0.0).astype(np.float32),
                         np.where(keep, version[:end], -1).astype(np.int32),
                         np.where(keep, reward[:end], 0.0).astype(np.float32), turn_idx[:end],
                         state_id[:end], np.where(keep, turn_reward[:end], 0.0).astype(np.float32),
                         invalid[:end]))  # like turn_idx, the earlier turns' flags stay on their context
    else:
      obs = t.obs_ids if k == 0 else np.asarray(tokenizer.observation_ids(t.observation, s.prompt), np.int32)
      n_obs, n_act = len(obs), len(t.action_ids)
      act_reward = np.zeros(n_act, np.float32)
      act_turn_reward = np.zeros(n_act, np.float32)
      if n_act:
        act_reward[-1] = t.reward
        act_turn_reward[-1] = float(t.info.get("turn_reward", 0.0))
      out.append(_Sample(
          i, k, np.concatenate([obs, t.action_ids]).astype(np.int32),
          np.concatenate([np.zeros(n_obs, np.float32), np.ones(n_act, np.float32)]),
          np.concatenate([np.zeros(n_obs, np.float32), t.logp]).astype(np.float32),
          np.concatenate([np.full(n_obs, -1, np.int32), t.version]).astype(np.int32),
          np.concatenate([np.zeros(n_obs, np.float32), act_reward]),
          np.full(n_obs + n_act, k, np.int32),
          np.full(n_obs + n_act, state_id[start] if t.num_tokens else -1, np.int32),
          np.concatenate([np.zeros(n_obs, np.float32), act_turn_reward]),
          np.full(n_obs + n_act, bool(t.invalid_action))))
    start = end
  return out


def _dense(ids: list[int]) -> list[int]:
  """Ranks of ids in order of first appearance."""
  table: dict[int, int] = {}
  return [table.setdefault(x, len(table)) for x in ids]


def pack_sessions(sessions: Sequence[Session], *, layout: str = "session", context: str = "history",
                  tokenizer=None, length_buckets: Sequence[int] | None = None, min_length: int = 16,
                  batch_multiple: int = 1, min_batch: int = 0, pad_id: int = 0) -> PackedBatch:
  """Packs trainable sessions into one `PackedBatch`.

  Args:
    sessions: finished sessions; any with `trainable == False` (env errors,
      no generated tokens) is rejected: filter them out first.
    layout: 'session' or 'turn'.
    context: for the 'turn' layout, 'history' or 'markov'.
    tokenizer: needed for context='markov' only.
    length_buckets: allowed T values; default powers of two >= min_length.
    batch_multiple: pad B up to a multiple of this (e.g. the data-parallel
      device count); min_batch: pad B up to at least this.
    pad_id: token id written on padding positions.
  """
  if layout not in LAYOUTS:
    raise ValueError(f"layout={layout!r}; valid: {LAYOUTS}")
  if context not in CONTEXTS:
    raise ValueError(f"context={context!r}; valid: {CONTEXTS}")
  if layout == "turn" and context == "markov" and tokenizer is None:
    raise ValueError("context='markov' needs tokenizer= to rebuild each turn's prompt head")
  if batch_multiple < 1:
    raise ValueError(f"batch_multiple must be >= 1, got {batch_multiple}")
  for i, s in enumerate(sessions):
    if not s.trainable:
      raise ValueError(f"sessions[{i}] (session_id={s.session_id}, end_reason={s.end_reason!r}, "
                       f"{s.num_action_tokens} action tokens) is not trainable")

  samples: list[_Sample] = []
  key_ids: dict = {}  # anchor state key -> its id in this batch
  for i, s in enumerate(sessions):
    if layout == "session":
      samples.append(_session_sample(i, s, key_ids))
    else:
      samples.extend(_turn_samples(i, s, context, tokenizer, key_ids))

  n_real = len(samples)
  b = max(n_real, int(min_batch), 1)
  b = -(-b // batch_multiple) * batch_multiple
  t = bucket_length(max([len(x.tokens) for x in samples], default=1), length_buckets, min_length)

  tokens = np.full((b, t), pad_id, np.int32)
  targets = np.full((b, t), pad_id, np.int32)
  mask = np.zeros((b, t), np.float32)
  logp = np.zeros((b, t), np.float32)
  version = np.full((b, t), -1, np.int32)
  reward = np.zeros((b, t), np.float32)
  turn_idx = np.zeros((b, t), np.int32)
  state_id = np.full((b, t), -1, np.int32)
  turn_reward = np.zeros((b, t), np.float32)
  invalid = np.zeros((b, t), bool)
  positions = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy()
  for r, x in enumerate(samples):
    n = len(x.tokens)
    tokens[r, :n] = x.tokens
    # Shift by one: position i predicts token i + 1.
    targets[r, :n - 1] = x.tokens[1:]
    mask[r, :n - 1] = x.mask[1:]
    logp[r, :n - 1] = x.logp[1:]
    version[r, :n - 1] = x.version[1:]
    reward[r, :n - 1] = x.reward[1:]
    turn_idx[r, :n - 1] = x.turn_idx[1:]
    state_id[r, :n - 1] = x.state_id[1:]
    turn_reward[r, :n - 1] = x.turn_reward[1:]
    invalid[r, :n - 1] = x.invalid[1:]
    if x.mask[0]:
      raise ValueError(f"sample {r} (session index {x.session_index}) starts with an action token, "
                       "which has no logits to be scored from")

  # Padding rows get their own fresh ids so they never join a real group.
  sess = [sessions[x.session_index] for x in samples]
  n_pad = b - n_real
  group = _dense([s.group_id for s in sess])
  tree = _dense([s.tree_id for s in sess])
  episode = _dense([s.session_id for s in sess])
  for ids in (group, tree, episode):
    base = max(ids, default=-1) + 1
    ids.extend(range(base, base + n_pad))

  def per_sample(values, dtype, fill):
    return np.asarray(list(values) + [fill] * n_pad, dtype)

  return PackedBatch(
      tokens_bt=tokens, targets_bt=targets, loss_mask_bt=mask, behav_logp_bt=logp,
      version_bt=version, reward_bt=reward, turn_idx_bt=turn_idx, positions_bt=positions,
      group_id_b=np.asarray(group, np.int32), tree_id_b=np.asarray(tree, np.int32),
      episode_id_b=np.asarray(episode, np.int32),
      return_b=per_sample((s.episode_return for s in sess), np.float32, 0.0),
      success_b=per_sample((float(s.success) for s in sess), np.float32, 0.0),
      num_turns_b=per_sample((s.num_turns for s in sess), np.int32, 0),
      sample_valid_b=per_sample([1.0] * n_real, np.float32, 0.0),
      session_index_b=per_sample((x.session_index for x in samples), np.int32, -1),
      sample_turn_b=per_sample((x.turn for x in samples), np.int32, -1),
      length_b=per_sample((len(x.tokens) for x in samples), np.int32, 0),
      state_id_bt=state_id, turn_reward_bt=turn_reward, invalid_bt=invalid,
  )
