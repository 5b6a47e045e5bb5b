"""Session records: one played episode, token by token.

A session is the unit the rest of the pipeline trades in: the engine fills it,
packing turns many of them into arrays, the staleness queue reads its policy
versions, and the ledger counts its tokens. It keeps both the text (for logs
and env replay) and the exact token ids the policy saw and produced, with the
behaviour log-prob and the policy version of every generated token.

Token layout of a session (what the KV cache held, in order):

    turn 0: tokenizer.observation_ids(obs_0, prompt)  then action_0 ids
    turn t: continuation_ids(tokenizer, prompt, turns before t, obs_t)  then action_t ids
            (byte tokenizer: observation_ids(obs_t); a chat template: the
            text its rendering adds after the cached ids, models/chat.py)

Action ids are exactly the generated ids, ending with the stop token (eos)
unless the turn was cut by its token budget. The observation that follows the
last action (e.g. "right") is kept as text only: no policy ever acted on it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

# rewritten: the chat template renders a reply differently from how it was sampled, so
# the next turn's context cannot be built token-in/token-out (models/chat.py); never trained.
END_REASONS = ("terminated", "truncated", "context_cap", "env_error", "rewritten")


class Turn(NamedTuple):
  """One observation -> action -> reward exchange.

  Attributes:
    observation: the text the policy acted on.
    obs_ids: int32 [n_obs] ids prefilled before acting (turn 0 includes the
      prompt head).
    action: the text sent to the env (generated ids decoded, stop token
      dropped).
    action_ids: int32 [n_act] generated ids, stop token included if hit.
    logp: f32 [n_act] behaviour log-prob of each generated id, under the
      sampling distribution actually used.
    version: int32 [n_act] policy version that generated each id.
    reward: the env reward for this action (0 on an env error).
    cut_at_budget: generation hit the per-turn token budget (no stop token).
    invalid_action: the env said the action was malformed or illegal.
    env_error: the env raised on this action; the session ends here.
    info: the env's step info (or {'error': message} on an env error).
  """
  observation: str
  obs_ids: np.ndarray
  action: str
  action_ids: np.ndarray
  logp: np.ndarray
  version: np.ndarray
  reward: float
  cut_at_budget: bool = False
  invalid_action: bool = False
  env_error: bool = False
  info: dict = {}

  @property
  def num_tokens(self) -> int:
    return len(self.obs_ids) + len(self.action_ids)


def make_turn(observation: str, obs_ids, action: str, action_ids, logp, version, reward: float,
              **flags) -> Turn:
  """A `Turn` with arrays coerced to their dtypes and lengths checked."""
  obs_ids = np.asarray(obs_ids, np.int32).reshape(-1)
  action_ids = np.asarray(action_ids, np.int32).reshape(-1)
  logp = np.asarray(logp, np.float32).reshape(-1)
  version = np.broadcast_to(np.asarray(version, np.int32), action_ids.shape).copy()
  if logp.shape != action_ids.shape:
    raise ValueError(f"Turn.logp has {logp.size} entries for {action_ids.size} action_ids")
  flags["info"] = dict(flags.get("info") or {})  # never share the NamedTuple's default dict
  return Turn(observation, obs_ids, action, action_ids, logp, version, float(reward), **flags)


@dataclasses.dataclass
class Session:
  """A whole episode of one env instance under the policy.

  `group_id` ties the sessions started from the same task and seed (the GRPO
  group). Tree rollouts (rollout/tree.py): a session forks from turn
  `branch_of[1]` of session `branch_of[0]` (it shares the turns before that
  one and that turn's observation), `tree_id` is the root's session id and
  `node_id` the session's leaf index inside its tree (chain rollouts:
  `tree_id == session_id`, `node_id == 0`, `branch_of is None`).
  """
  session_id: int
  task_id: int
  group_id: int
  seed: int
  env_name: str
  tree_id: int = -1
  node_id: int = 0
  branch_of: tuple[int, int] | None = None
  prompt: str = ""
  turns: list[Turn] = dataclasses.field(default_factory=list)
  final_observation: str | None = None
  end_reason: str | None = None  # one of END_REASONS once the session is over
  success: bool = False
  error: str | None = None  # the env exception's message (or why the template rewrote a reply), if any

  def __post_init__(self):
    if self.tree_id < 0:
      self.tree_id = self.session_id
    if self.end_reason is not None and self.end_reason not in END_REASONS:
      raise ValueError(f"Session.end_reason={self.end_reason!r}; valid: {END_REASONS}")

  def finish(self, reason: str, *, success: bool = False, error: str | None = None) -> None:
    if reason not in END_REASONS:
      raise ValueError(f"Session.end_reason={reason!r}; valid: {END_REASONS}")
    self.end_reason, self.success, self.error = reason, bool(success), error

  # -- session-level summaries ---------------------------------------------

  @property
  def num_turns(self) -> int:
    return len(self.turns)

  @property
  def episode_return(self) -> float:
    return float(sum(t.reward for t in self.turns))

  @property
  def done(self) -> bool:
    return self.end_reason is not None

  @property
  def terminated(self) -> bool:
    return self.end_reason == "terminated"

  @property
  def truncated(self) -> bool:
    return self.end_reason == "truncated"

  @property
  def context_cap(self) -> bool:
    return self.end_reason == "context_cap"

  @property
  def env_error(self) -> bool:
    return self.end_reason == "env_error"

  @property
  def rewritten(self) -> bool:
    return self.end_reason == "rewritten"

  @property
  def own_turns(self) -> list[Turn]:
    """The turns this session paid for: after a fork, the shared ones belong
    to the parent (the turn it forked at still counts its action)."""
    return self.turns if self.branch_of is None else self.turns[self.branch_of[1]:]

  @property
  def num_action_tokens(self) -> int:
    return int(sum(len(t.action_ids) for t in self.turns))

  @property
  def num_obs_tokens(self) -> int:
    return int(sum(len(t.obs_ids) for t in self.turns))

  @property
  def trainable(self) -> bool:
    """Finished, no env failure, no rewritten reply, and at least one generated token.

    An env error says nothing about the policy, so such a session must never
    be trained on as if its (truncated) return were earned. A session ended
    because its template rewrote a reply (end_reason 'rewritten') is left out
    too: its return is cut short by the reply's form, so training on it would
    reward or punish whitespace rather than play (docs/real_model.md).
    """
    return self.done and not self.env_error and not self.rewritten and self.num_action_tokens > 0

  def min_version(self) -> int | None:
    """Oldest policy version among the generated tokens (None if none)."""
    versions = [int(t.version.min()) for t in self.turns if len(t.version)]
    return min(versions) if versions else None

  def max_version(self) -> int | None:
    versions = [int(t.version.max()) for t in self.turns if len(t.version)]
    return max(versions) if versions else None

  # -- flat per-token views (input-aligned: entry i describes token i) -----

  def _flat(self, obs_fill, act_field, dtype) -> np.ndarray:
    parts = []
    for t in self.turns:
      parts.append(np.full(len(t.obs_ids), obs_fill, dtype) if obs_fill is not None else t.obs_ids)
      parts.append(np.asarray(getattr(t, act_field), dtype))
    return np.concatenate(parts).astype(dtype) if parts else np.zeros((0,), dtype)

  def flat_tokens(self) -> np.ndarray:
    """int32 [L]: every token of the session in cache order."""
    return self._flat(None, "action_ids", np.int32)

  def loss_mask(self) -> np.ndarray:
    """f32 [L]: 1 on generated (action) tokens, 0 on observation tokens."""
    parts = [p for t in self.turns
             for p in (np.zeros(len(t.obs_ids), np.float32), np.ones(len(t.action_ids), np.float32))]
    return np.concatenate(parts) if parts else np.zeros((0,), np.float32)

  def flat_logp(self) -> np.ndarray:
    """f32 [L]: behaviour log-prob on action tokens, 0 elsewhere."""
    return self._flat(0.0, "logp", np.float32)

  def flat_version(self) -> np.ndarray:
    """int32 [L]: policy version on action tokens, -1 elsewhere."""
    return self._flat(-1, "version", np.int32)

  def flat_turn_idx(self) -> np.ndarray:
    """int32 [L]: the turn each token belongs to."""
    parts = [np.full(t.num_tokens, i, np.int32) for i, t in enumerate(self.turns)]
    return np.concatenate(parts) if parts else np.zeros((0,), np.int32)

  def flat_turn_reward(self) -> np.ndarray:
    """f32 [L]: each turn's `info["turn_reward"]` (the env's verifiable per-turn
    signal, not part of the return) on its last action token, 0 elsewhere."""
    out = np.zeros(sum(t.num_tokens for t in self.turns), np.float32)
    end = 0
    for t in self.turns:
      end += t.num_tokens
      if len(t.action_ids):
        out[end - 1] += float(t.info.get("turn_reward", 0.0))
    return out

  def state_keys(self) -> list:
    """Each turn's anchor state: the env's `info["state_key"]` (the state the
    action was taken in), None where the env gave none."""
    return [t.info.get("state_key") for t in self.turns]

  def flat_reward(self) -> np.ndarray:
    """f32 [L]: each turn's reward on its last action token, 0 elsewhere."""
    out = np.zeros(sum(t.num_tokens for t in self.turns), np.float32)
    end = 0
    for t in self.turns:
      end += t.num_tokens
      if len(t.action_ids):
        out[end - 1] += t.reward
    return out

  # -- serialisation (queues, logs, datasets) ------------------------------

  def to_dict(self) -> dict[str, Any]:
    """A JSON-friendly dict (arrays become lists); inverse of `from_dict`."""
    d = dataclasses.asdict(self)
    d["turns"] = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in t._asdict().items()}
                  for t in self.turns]
    d["branch_of"] = None if self.branch_of is None else list(self.branch_of)
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "Session":
    d = dict(d)
    turns = [make_turn(**t) for t in d.pop("turns", [])]
    branch = d.pop("branch_of", None)
    return cls(**d, turns=turns, branch_of=None if branch is None else tuple(branch))
