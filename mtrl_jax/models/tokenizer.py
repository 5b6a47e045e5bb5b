"""Tokenizers: a built-in byte-level one (offline, tiny vocab) and a wrapper
for a local Hugging Face tokenizer folder.

Both expose the same small surface the rollout code needs: encode/decode, the
ids of padding, end-of-action and the stop ids, `observation_ids` (the first
turn's prefill) and, through `continuation_ids(tokenizer, prompt, history,
observation)`, every later turn's. The byte tokenizer's layout:

    [bos] [sys] prompt   (first turn only)
    [obs] observation [act]      <- prefilled, loss mask 0
    action bytes ... [eos]       <- generated, loss mask 1

A Hugging Face tokenizer lays sessions out with the model's chat template
(models/chat.py), token-in/token-out.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Protocol, Sequence


class Tokenizer(Protocol):
  vocab_size: int
  pad_id: int
  eos_id: int

  def encode(self, text: str) -> list[int]: ...
  def decode(self, ids: Sequence[int]) -> str: ...
  def observation_ids(self, observation: str, prompt: str | None = None) -> list[int]: ...


SPECIALS = ("<pad>", "<bos>", "<eos>", "<obs>", "<act>", "<sys>", "<unused6>", "<unused7>")


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
  """UTF-8 bytes shifted past 8 special ids: vocab 264, no files needed."""

  pad_id: int = 0
  bos_id: int = 1
  eos_id: int = 2
  obs_id: int = 3
  act_id: int = 4
  sys_id: int = 5
  offset: int = len(SPECIALS)

  @property
  def vocab_size(self) -> int:
    return self.offset + 256

  def encode(self, text: str) -> list[int]:
    return [b + self.offset for b in text.encode("utf-8")]

  def decode(self, ids: Sequence[int]) -> str:
    """Drops special ids; stops at nothing (callers cut at eos themselves)."""
    data = bytes(int(i) - self.offset for i in ids if int(i) >= self.offset)
    return data.decode("utf-8", errors="replace")

  @property
  def stop_ids(self) -> tuple[int, ...]:
    return (self.eos_id,)

  def observation_ids(self, observation: str, prompt: str | None = None) -> list[int]:
    head = [] if prompt is None else [self.bos_id, self.sys_id] + self.encode(prompt)
    return head + [self.obs_id] + self.encode(observation) + [self.act_id]


class HFTokenizer:
  """A local Hugging Face tokenizer folder (`tokenizers` library; no hub access).

  Reads `tokenizer.json`, `tokenizer_config.json` (special tokens, chat
  template), `chat_template.jinja` (where transformers 5 keeps the template;
  it wins over the config's copy, as in transformers) and
  `generation_config.json` (the stop ids: its `eos_token_id`, one id or a
  list). Sessions are laid out by the model's own chat template, turn by turn
  (models/chat.py: `ChatFormat`); a folder without a template gets plain
  ChatML (`chat.DEFAULT_CHATML`).

  Args:
    path: the folder, or its tokenizer.json.
    eos_token / pad_token: override the config's.
    chat_template: a jinja string (or a path to a .jinja file) replacing the
      folder's template.
    prompt_role: where an env's task prompt goes: 'system' (replaces a
      template's default system prompt) or 'user' (opens the first user
      message; the default system prompt stays).
  """

  def __init__(self, path: str, *, eos_token: str | None = None, pad_token: str | None = None,
               chat_template: str | None = None, prompt_role: str = "system"):
    try:
      from tokenizers import Tokenizer as _HFTok
    except ImportError as e:  # pragma: no cover - depends on the install
      raise ImportError('HFTokenizer needs `tokenizers`: pip install -e ".[hf]"') from e
    from mtrl_jax.models import chat
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
      raise FileNotFoundError(f"no tokenizer.json at {file}")
    folder = os.path.dirname(file)
    self._tok = _HFTok.from_file(file)
    cfg = _read_json(os.path.join(folder, "tokenizer_config.json"))
    eos_token = eos_token or _token_str(cfg.get("eos_token")) or "<|im_end|>"
    pad_token = pad_token or _token_str(cfg.get("pad_token")) or eos_token
    self.eos_id = self._id(eos_token, "eos_token")
    self.pad_id = self._id(pad_token, "pad_token")
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    gen = _read_json(os.path.join(folder, "generation_config.json"))
    stop = gen.get("eos_token_id")
    stop = [stop] if isinstance(stop, int) else list(stop or [])
    for i in stop:
      if not 0 <= int(i) < self.vocab_size:
        raise ValueError(f"generation_config.json eos_token_id {i} is outside the vocabulary ({self.vocab_size})")
    # Stop ids come from generation_config (Llama 3 lists several); without one, the eos token.
    self.stop_ids = tuple(int(i) for i in stop) or (self.eos_id,)
    if chat_template is not None and os.path.isfile(chat_template):
      with open(chat_template) as f:
        chat_template = f.read()
    jinja_file = os.path.join(folder, "chat_template.jinja")
    if chat_template is None and os.path.exists(jinja_file):
      with open(jinja_file) as f:
        chat_template = f.read()
    template_src = chat_template or cfg.get("chat_template")
    if isinstance(template_src, list):  # several named templates: the default one
      template_src = next((t["template"] for t in template_src if t.get("name") == "default"), None)
    self.has_own_template = bool(template_src)
    self.chat_template = template_src or chat.DEFAULT_CHATML
    specials = {k: _token_str(cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    specials.update(eos_token=eos_token, pad_token=pad_token)
    self.chat = chat.ChatFormat(chat.ChatTemplate(self.chat_template, specials), self.encode,
                                lambda ids: self.decode(ids, skip_special_tokens=False), self.stop_ids,
                                prompt_role=prompt_role)
    # A turn closes with what the template writes after a reply, whatever the eos (Gemma-style
    # folders: eos <eos>, turns end <end_of_turn>): demos end their actions with it, rollouts stop on it.
    special = [i for i, t in self._tok.get_added_tokens_decoder().items() if t.special]
    eot = self.chat.end_of_turn_id(special)
    self.end_of_turn_id = self.eos_id if eot is None else eot
    if self.end_of_turn_id not in self.stop_ids:
      self.stop_ids += (self.end_of_turn_id,)
      self.chat.stop_ids = frozenset(self.stop_ids)

  def _id(self, token: str, field: str) -> int:
    tid = self._tok.token_to_id(token)
    if tid is None:
      raise ValueError(f"{field}={token!r} is not in the vocabulary of this tokenizer.json")
    return tid

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def observation_ids(self, observation: str, prompt: str | None = None) -> list[int]:
    """The first turn's prefill: the template's conversation of (prompt, observation)."""
    return self.chat.first_ids(observation, prompt)

  def continuation_ids(self, prompt: str | None, history, observation: str) -> list[int]:
    """Prefill ids of `observation` after the turns in `history` (chat.HistoryTurn's)."""
    return self.chat.next_ids(prompt, history, observation)


def continuation_ids(tokenizer, prompt: str | None, history, observation: str) -> list[int]:
  """The ids to prefill before the policy answers `observation`, after `history`.

  history: the session's finished turns (anything with `.observation`,
  `.obs_ids`, `.action_ids`: rollout Turns, chat.HistoryTurn). A tokenizer
  with `continuation_ids` (chat templates) sees the whole history; the byte
  tokenizer's layout needs none (the prompt head only on the first turn).
  """
  fn = getattr(tokenizer, "continuation_ids", None)
  if fn is not None:
    return list(fn(prompt, history, observation))
  return list(tokenizer.observation_ids(observation, prompt if not history else None))


def _read_json(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _token_str(tok) -> str | None:
  if isinstance(tok, dict):
    return tok.get("content")
  return tok
