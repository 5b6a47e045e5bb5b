"""Monte-Carlo continuations from forked states: the value of a history.

V(h_t) for a fixed policy is the expected return from turn t on, given the
history h_t (every token up to and including turn t's observation) and the
environment's state there. Forking h_t k times (cache rows copied with
`Sampler.fork`, env cloned) and playing each fork to the end with the
policy gives k independent returns whose mean is an unbiased estimate of
V(h_t), with standard error std / sqrt(k).

Each continuation's next prefill is built the way the rollout engine builds
it (`models.tokenizer.continuation_ids`): a chat template renders every turn
after the whole conversation so far, so a start carries the session's prompt
and finished turns, and every fork extends its own copy with the actions it
samples. The byte layout needs none of that history (it gives the same ids).

Env randomness the policy has not seen yet (reward noise, payoff draws, slips)
is drawn afresh for every fork by default (`fork_randomness='fresh'`, through
`Env.redraw`): V(h_t) then marginalises over it, as the policy's own value does.
`fork_randomness='crn'` keeps the session's own draws in every fork (common random
numbers: lower variance, but a value conditioned on a future the policy cannot see).
"""
from __future__ import annotations

import concurrent.futures
from typing import Callable, NamedTuple, Sequence

import jax
import numpy as np

from mtrl_jax.envs.base import derive_seed
from mtrl_jax.models.chat import HistoryTurn
from mtrl_jax.models.tokenizer import continuation_ids
from mtrl_jax.rollout.tree import clone_env


class Start(NamedTuple):
  """A history to continue from."""
  env: object         # the env in the state the history left it (not stepped here)
  prefix_ids: list    # every token the policy saw and produced, through turn t's observation
  turns_done: int     # t: turns played before this history's next action
  # What a chat template needs to render the turns after this one: the session's task prompt,
  # its finished turns (HistoryTurn: observation, obs ids, action ids as sampled) and turn t's
  # observation with its prefill ids (the tail of prefix_ids).
  prompt: str | None = None
  history: tuple = ()
  observation: str = ""
  obs_ids: tuple = ()


FORK_RANDOMNESS = ("fresh", "crn")


def fork_envs(env, k: int, fresh_seed: int | None) -> list:
  """k independent copies of `env` in its state; with `fresh_seed`, each draws its own unseen
  randomness (fork j redraws from derive_seed(fresh_seed, j)), else all keep `env`'s draws."""
  forks = [clone_env(env) for _ in range(k)]
  if fresh_seed is not None:
    for j, f in enumerate(forks):
      f.redraw(derive_seed("fork", fresh_seed, j))
  return forks


class ContinuationStats(NamedTuple):
  returns_sk: np.ndarray   # f32 [S, K]: return from turn t on of each continuation
  tokens_generated: int
  tokens_prefilled: int


def continue_from(sampler, tokenizer, starts: Sequence[Start], k: int, *, turn_budget: int,
                  context_cap: int, sampling, rng: jax.Array, max_turns: int | None = None,
                  rows_per_call: int = 256, num_env_threads: int = 4,
                  progress: Callable[[int], None] | None = None,
                  fork_randomness: str = "fresh") -> ContinuationStats:
  """Plays k continuations of every start to the end; returns their returns.

  Starts are processed in chunks of rows_per_call // k (the last chunk is
  padded with copies so every call has the same shapes). A continuation
  ends when its env ends, at `max_turns` total turns, or when the next turn
  would not fit in `context_cap` (its return so far is kept). `progress`, if
  given, is called with the number of starts done after every chunk.
  `fork_randomness`: 'fresh' (each fork draws the env randomness not yet seen) or
  'crn' (every fork keeps the start's draws); see the module doc.
  """
  if fork_randomness not in FORK_RANDOMNESS:
    raise ValueError(f"lab.fork_randomness must be one of {FORK_RANDOMNESS}, got {fork_randomness!r}")
  if hasattr(tokenizer, "continuation_ids") and any(s.turns_done != len(s.history) or not s.obs_ids
                                                     for s in starts):
    raise ValueError("a chat-template tokenizer renders each turn after the session's whole history: every "
                     "Start needs `history` (its turns_done finished turns) and turn t's `observation`/`obs_ids` "
                     "(lab.credit_accuracy.histories builds them)")
  per_chunk = max(rows_per_call // k, 1)
  out = np.zeros((len(starts), k), np.float32)
  gen = pre = 0
  stop_ids = frozenset(int(i) for i in sampler.stop_ids)
  with concurrent.futures.ThreadPoolExecutor(num_env_threads) as pool:
    for c0 in range(0, len(starts), per_chunk):
      chunk = list(starts[c0:c0 + per_chunk])
      real = len(chunk)
      chunk += [chunk[-1]] * (per_chunk - real)
      rng, key = jax.random.split(rng)
      state = sampler.append(sampler.init_state(per_chunk, context_cap), [s.prefix_ids for s in chunk])
      pre += sum(len(s.prefix_ids) for s in chunk[:real])
      state = sampler.fork(state, range(per_chunk), k)
      n = per_chunk * k
      rng, env_key = jax.random.split(rng)
      fresh = int(jax.random.randint(env_key, (), 0, 2**31 - 1)) if fork_randomness == "fresh" else None
      envs = [f for i, s in enumerate(chunk)
              for f in fork_envs(s.env, k, None if fresh is None else derive_seed(fresh, i))]
      turns = np.array([chunk[r // k].turns_done for r in range(n)])
      ret = np.zeros(n, np.float64)
      live = {r: [] for r in range(n)}  # row -> ids to append before its next action
      # Per row: its finished turns, and the observation (text, ids) its next action answers.
      hist = [list(chunk[r // k].history) for r in range(n)]
      pending = [(chunk[r // k].observation, tuple(chunk[r // k].obs_ids)) for r in range(n)]
      step_i = 0
      while live:
        lengths = sampler.lengths(state)
        for r in list(live):
          if lengths[r] + len(live[r]) + turn_budget > context_cap:
            del live[r]
        if not live:
          break
        state = sampler.append(state, [live.get(r, []) for r in range(n)])
        pre += sum(len(v) for r, v in live.items() if r // k < real)
        active = np.zeros(n, bool)
        active[list(live)] = True
        gen_out, state = sampler.generate(state, jax.random.fold_in(key, step_i), turn_budget,
                                          active=active, params=sampling)
        step_i += 1
        rows = sorted(live)
        texts = {}
        for r in rows:
          ids = [int(x) for x in gen_out.tokens[r]]
          if r // k < real:
            gen += len(ids)
          stopped = bool(ids) and ids[-1] in stop_ids
          texts[r] = tokenizer.decode(ids[:-1] if stopped else ids)
          hist[r].append(HistoryTurn(pending[r][0], pending[r][1], tuple(ids)))
        steps = list(pool.map(lambda r: envs[r].step(texts[r]), rows))
        nxt = {}
        for r, st in zip(rows, steps):
          ret[r] += st.reward
          turns[r] += 1
          over = max_turns is not None and turns[r] >= max_turns
          if not (st.terminated or st.truncated or over):
            nxt[r] = continuation_ids(tokenizer, chunk[r // k].prompt, hist[r], st.observation)
            pending[r] = (st.observation, tuple(nxt[r]))
        live = nxt
      out[c0:c0 + real] = ret.reshape(per_chunk, k)[:real]
      if progress is not None:
        progress(c0 + real)
  return ContinuationStats(out, gen, pre)
