"""Tokenizers: a built-in byte-level one (offline, tiny vocab) and a wrapper
for a local Hugging Face `tokenizer.json`.

Both expose the same small surface the rollout code needs: encode/decode, the
ids of padding and end-of-action, and `observation_ids`, which turns an
environment message into the tokens prefilled before the policy acts:

    [bos] [sys] prompt   (first turn only)
    [obs] observation [act]      <- prefilled, loss mask 0
    action bytes ... [eos]       <- generated, loss mask 1
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

  def observation_ids(self, observation: str, prompt: str | None = None) -> list[int]:
    head = [] if prompt is None else [self.bos_id, self.sys_id] + self.encode(prompt)
    return head + [self.obs_id] + self.encode(observation) + [self.act_id]


class HFTokenizer:
  """A local `tokenizer.json` (the `tokenizers` library; no hub access).

  Observations are wrapped in text markers (default: a Qwen-style chat turn)
  because HF vocabularies have no dedicated observation/action ids.
  """

  def __init__(self, path: str, *, eos_token: str | None = None, pad_token: str | None = None,
               obs_template: str = "<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n",
               prompt_template: str = "<|im_start|>system\n{prompt}<|im_end|>\n"):
    try:
      from tokenizers import Tokenizer as _HFTok
    except ImportError as e:  # pragma: no cover - depends on the install
      raise ImportError('HFTokenizer needs `tokenizers`: pip install -e ".[hf]"') from e
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
      raise FileNotFoundError(f"no tokenizer.json at {file}")
    self._tok = _HFTok.from_file(file)
    cfg_file = os.path.join(os.path.dirname(file), "tokenizer_config.json")
    cfg = json.load(open(cfg_file)) if os.path.exists(cfg_file) else {}
    eos_token = eos_token or _token_str(cfg.get("eos_token")) or "<|im_end|>"
    pad_token = pad_token or _token_str(cfg.get("pad_token")) or eos_token
    self.eos_id = self._id(eos_token, "eos_token")
    self.pad_id = self._id(pad_token, "pad_token")
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self.obs_template, self.prompt_template = obs_template, prompt_template

  def _id(self, token: str, field: str) -> int:
    tid = self._tok.token_to_id(token)
    if tid is None:
      raise ValueError(f"{field}={token!r} is not in the vocabulary of this tokenizer.json")
    return tid

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

  def observation_ids(self, observation: str, prompt: str | None = None) -> list[int]:
    text = self.obs_template.format(observation=observation)
    if prompt is not None:
      text = self.prompt_template.format(prompt=prompt) + text
    return self.encode(text)


def _token_str(tok) -> str | None:
  if isinstance(tok, dict):
    return tok.get("content")
  return tok
