"""Chat models that survive their own samples (issue 34, item 1).

A trimming template (Llama-3 / Gemma families `| trim` a reply) renders a
sampled reply with whitespace at either end, or cut at the budget after a
newline, otherwise than the cache holds it; a folder whose tokenizer eos is
not the template's end-of-turn token closes turns with the latter. Each must
end only its own session (end_reason 'rewritten', untrained, counted in the
metrics), in both engines, never the job; demos close turns as the template
does. Built on the tiny BPE folder (tests/conftest.py `tokenizer_dir`).
"""
import functools
import json
import os
import shutil
from types import SimpleNamespace

import jax
import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from rollout_fixtures import CountEnv, ScriptedSampler  # noqa: E402
from mtrl_jax.models.chat import BrokenPrefixError, HistoryTurn  # noqa: E402
from mtrl_jax.models.tokenizer import HFTokenizer  # noqa: E402
from mtrl_jax.rollout.engine import RolloutEngine  # noqa: E402
from mtrl_jax.rollout.packing import pack_sessions  # noqa: E402
from mtrl_jax.train.sft import demo_tokens  # noqa: E402
from mtrl_jax.train.evaluate import session_stats  # noqa: E402
from mtrl_jax.train.source import SyncSource  # noqa: E402

# ChatML whose replies (all messages) are trimmed, as Llama 3's and Gemma's templates do.
TRIM_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}")
# Gemma-2 style: no system role (folded into the first user turn), 'model' turns, trim, <end_of_turn>.
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = "
    "messages[0]['content'] + '\\n\\n' %}{% set loop_messages = messages[1:] %}{% else %}"
    "{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
    "(first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")
GEMMA_SPECIALS = ["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"]


@pytest.fixture(scope="module")
def trim_tok(tokenizer_dir):
  return HFTokenizer(str(tokenizer_dir), chat_template=TRIM_CHATML)


@pytest.fixture(scope="module")
def gemma_dir(tokenizer_dir, tmp_path_factory):
  """An instruct folder laid out as Gemma's: tokenizer eos <eos>, the template's
  turns end with <end_of_turn>, generation_config stops on <eos> only."""
  import tokenizers
  out = tmp_path_factory.mktemp("gemma_tok")
  tok = tokenizers.Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIALS])
  tok.save(str(out / "tokenizer.json"))
  json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "chat_template": GEMMA},
            open(out / "tokenizer_config.json", "w"))
  json.dump({"eos_token_id": tok.token_to_id("<eos>")}, open(out / "generation_config.json", "w"))
  return str(out)


def _text(tok, ids):
  return tok.decode(ids, skip_special_tokens=False)


# ---------------------------------------------------------------- the causes
def _cause(tok, action_ids, obs="the door"):
  first = tok.observation_ids(obs, None)
  with pytest.raises(BrokenPrefixError) as e:
    tok.continuation_ids(None, [HistoryTurn(obs, first, action_ids)], "left")
  assert e.value.turn == 1
  return e.value


def test_each_rewritten_reply_names_its_cause(trim_tok, tokenizer_dir):
  """A reply cut at the budget right after a newline gets its own message
  (the cut, not history rewriting); whitespace around a stopped reply is
  'reply'; a stop id the template does not write is 'stop_token'.
  Break checked: classifying every non-stopped reply as cut_at_budget
  (without the rstrip test) fails the leading-space cut case."""
  tok, eot = trim_tok, trim_tok.end_of_turn_id
  e = _cause(tok, tok.encode("the agent\n"))  # cut: no end-of-turn id
  assert e.cause == "cut_at_budget" and "cut at the token budget" in str(e) and "rewrites an earlier" not in str(e)
  assert _cause(tok, tok.encode(" the agent") + [eot]).cause == "reply"
  assert _cause(tok, tok.encode("the agent \n") + [eot]).cause == "reply"
  assert _cause(tok, tok.encode(" the agent")).cause == "reply"  # cut, but the leading space is the rewrite
  # A second stop id (as generation_config may list) that the template does not write.
  tok2 = HFTokenizer(str(tokenizer_dir), chat_template=TRIM_CHATML)
  tok2.chat.stop_ids = frozenset({eot, 0})
  e = _cause(tok2, tok2.encode("the agent") + [0])
  assert e.cause == "stop_token" and "'<|im_end|>\\n'" in str(e)
  # Kept as sampled: no error, and the next prefill is the template's text after the cache.
  hist = [HistoryTurn("o", tok.observation_ids("o", None), tok.encode("the agent") + [eot])]
  nxt = tok.continuation_ids(None, hist, "left")
  assert _text(tok, hist[0].obs_ids + hist[0].action_ids + nxt) == tok.chat.render(None, hist, "left")


# ---------------------------------------------------------- the lockstep engine
class ScriptedReplies(ScriptedSampler):
  """Row r's turn t action is SCRIPT[r][t] (ids, cut) when scripted, else a bare end-of-turn."""

  def __init__(self, tok, script, budget):
    super().__init__(tok=SimpleNamespace(eos_id=tok.end_of_turn_id, encode=tok.encode))
    self.stop_ids = tuple(tok.stop_ids)
    self.script, self.budget, self.turn = script, budget, {}

  def generate(self, state, rng, max_new_tokens, active=None, params=None):
    n = len(state["rows"])
    rows = list(state["rows"])
    tokens, logps, hit = [], [], np.zeros(n, bool)
    for b in range(n):
      ids = []
      if active[b]:
        t = self.turn.get(b, 0)
        self.turn[b] = t + 1
        ids, cut = self.script[b][t] if t < len(self.script[b]) else ([self.tok.eos_id], False)
        hit[b] = cut
      rows[b] = rows[b] + tuple(ids)
      tokens.append(np.asarray(ids, np.int32))
      logps.append(np.full(len(ids), -0.5, np.float32))
    self.last_state = {"rows": tuple(rows), "capacity": state["capacity"]}
    return SimpleNamespace(tokens=tokens, logps=logps, hit_budget=hit, ended_by_capacity=np.zeros(n, bool)), \
        self.last_state


def test_lockstep_engine_ends_only_the_rewritten_sessions(trim_tok):
  """Four sessions under a trimming template: a clean one, a leading-space
  reply, a reply cut after a newline, a trailing-space reply at turn 1.
  Each rewritten session ends there ('rewritten', untrained, its cause in
  `error`), the others play all 3 turns with the template's exact text, and
  SyncSource counts them in `rollout/rewritten_replies` and
  `ledger/end_rewritten` (evaluation: `eval/rewritten_replies`). Break
  checked: today's engine (no except) raises BrokenPrefixError out of `run`;
  `Session.trainable` without the rewritten test fails the trainable check;
  the metric line removed (source.py) fails its check."""
  tok, eot = trim_tok, trim_tok.end_of_turn_id
  enc = tok.encode
  script = [[(enc("7") + [eot], False)] * 3,
            [(enc(" 7") + [eot], False)],
            [(enc("7\n"), True)],
            [(enc("7") + [eot], False), (enc("3 ") + [eot], False)]]
  sampler = ScriptedReplies(tok, script, budget=2)
  engine = RolloutEngine(sampler, tok, functools.partial(CountEnv, horizon=3), group_size=1,
                         turn_token_budget=4, context_cap=256, num_env_threads=2, env_name="count")
  sessions, info = SyncSource(engine, seed=0, tasks_per_update=4).next_batch(0)
  assert [s.end_reason for s in sessions] == ["truncated", "rewritten", "rewritten", "rewritten"]
  assert [s.num_turns for s in sessions] == [3, 1, 1, 2]
  assert [s.error.split(":")[0] if s.error else None for s in sessions] == [None, "reply", "cut_at_budget", "reply"]
  assert [s.trainable for s in sessions] == [True, False, False, False]
  assert info["rollout/rewritten_replies"] == 3 and info["ledger/end_rewritten"] == 3
  assert session_stats(sessions, "eval/")["eval/rewritten_replies"] == 3
  # The survivor's ids are the cache's and the template's text of its conversation.
  s0 = sessions[0]
  assert s0.flat_tokens().tolist() == list(sampler.last_state["rows"][0])
  assert tok.chat.render(s0.prompt, s0.turns, None).startswith(_text(tok, s0.flat_tokens()))
  batch = pack_sessions([s for s in sessions if s.trainable], pad_id=tok.pad_id)
  assert batch.tokens_bt.shape[0] == 1


# ------------------------------------------- both engines, a random tiny model
@pytest.fixture(scope="module")
def tiny_sampler(trim_tok):
  from flax import nnx
  from mtrl_jax.models.config import ModelConfig
  from mtrl_jax.models.transformer import Transformer
  from mtrl_jax.sampling.sampler import Sampler
  cfg = ModelConfig(vocab_size=trim_tok.vocab_size, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8,
                    mlp_dim=64)
  policy = Transformer(cfg, rngs=nnx.Rngs(1))
  return Sampler.from_model(policy, pad_id=trim_tok.pad_id, stop_ids=trim_tok.stop_ids, log_compiles=False)


def test_both_engines_survive_their_own_samples(trim_tok, tiny_sampler):
  """A random policy at temperature 1 under a trimming template: its replies
  often start with a space token or are cut after one. The lockstep and the
  continuous engine end exactly the sessions whose template rendering does
  not extend their ids (checked here from the records, independently of the
  engines), and end the same ones. Break checked: without the engine's
  except, `run` raises BrokenPrefixError (both engines share `_record_turn`)."""
  from mtrl_jax.rollout.continuous import ContinuousEngine
  from mtrl_jax.sampling.sampler import SamplingParams
  kw = dict(group_size=2, turn_token_budget=3, context_cap=128, num_env_threads=2, env_name="count",
            sampling=SamplingParams(temperature=1.0))
  env = functools.partial(CountEnv, horizon=3)
  tasks = [1, 2, 3, 4]
  lock = RolloutEngine(tiny_sampler, trim_tok, env, **kw).run(tasks, jax.random.key(0)).sessions
  cont = ContinuousEngine(tiny_sampler, trim_tok, env, rows=3, chunk=2, **kw).run(tasks, jax.random.key(0)).sessions
  n_rewritten = sum(s.rewritten for s in lock)
  assert 0 < n_rewritten < len(lock), [s.end_reason for s in lock]
  for s in lock:
    text = _text(trim_tok, s.flat_tokens())
    follows = s.final_observation if s.rewritten else None
    extends = trim_tok.chat.render(s.prompt, s.turns, follows).startswith(text)
    assert s.rewritten == (not extends), (s.end_reason, text)
    assert s.trainable == (not s.rewritten)
  assert [s.end_reason for s in cont] == [s.end_reason for s in lock]
  assert [s.flat_tokens().tolist() for s in cont] == [s.flat_tokens().tolist() for s in lock]


# ---------------------------------------------- eos != the template's end of turn
def test_gemma_style_folder_closes_turns_with_end_of_turn(gemma_dir):
  """Tokenizer eos <eos>, template turns end <end_of_turn>: behaviour cloning
  closes demo actions with <end_of_turn> (today: <eos>, BrokenPrefixError at
  turn 1), the sampler stops on it, and the demo's ids are the template's
  text. Break checked: sft.py appending tokenizer.eos_id raises at turn 1;
  not adding end_of_turn_id to stop_ids fails the stop-id check."""
  tok = HFTokenizer(gemma_dir)
  eos, eot = tok._tok.token_to_id("<eos>"), tok._tok.token_to_id("<end_of_turn>")
  assert tok.eos_id == eos and tok.end_of_turn_id == eot
  assert tok.stop_ids == (eos, eot)
  demo = {"prompt": "move", "turns": [{"observation": "the door", "action": "left"},
                                      {"observation": "is locked", "action": "the agent"}]}
  ids, mask = demo_tokens(demo, tok)
  acts = [ids[i] for i in np.flatnonzero(mask)]
  assert acts == tok.encode("left") + [eot] + tok.encode("the agent") + [eot]
  history = [HistoryTurn("the door", [], tok.encode("left") + [eot]),
             HistoryTurn("is locked", [], tok.encode("the agent") + [eot])]
  assert _text(tok, ids.tolist()) == tok.chat.render("move", history, None).rstrip("\n")
  # A rollout reply that stops on <eos> (a stop id the template does not write) ends its session.
  first = tok.observation_ids("the door", "move")
  with pytest.raises(BrokenPrefixError) as e:
    tok.continuation_ids("move", [HistoryTurn("the door", first, tok.encode("left") + [eos])], "is locked")
  assert e.value.cause == "stop_token" and "<end_of_turn>" in str(e.value)
