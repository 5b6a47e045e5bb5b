"""Byte tokenizer round trips and the local tokenizer.json wrapper."""
import json

import pytest

from mtrl_jax.models.tokenizer import SPECIALS, ByteTokenizer, HFTokenizer

TEXTS = ["", "plain ascii", "héllo wörld", "日本語のテキスト", "emoji 🎲🧩 and\ttabs\nnewlines", "\x00nul"]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_round_trips_unicode(text):
  tok = ByteTokenizer()
  ids = tok.encode(text)
  assert len(ids) == len(text.encode("utf-8"))
  assert all(tok.offset <= i < tok.vocab_size for i in ids)
  assert tok.decode(ids) == text


def test_byte_tokenizer_specials_and_observation_layout():
  tok = ByteTokenizer()
  assert tok.vocab_size == 264 and len(SPECIALS) == tok.offset
  assert len({tok.pad_id, tok.bos_id, tok.eos_id, tok.obs_id, tok.act_id, tok.sys_id}) == 6
  first = tok.observation_ids("look", prompt="be brief")
  assert first == [tok.bos_id, tok.sys_id, *tok.encode("be brief"), tok.obs_id, *tok.encode("look"), tok.act_id]
  later = tok.observation_ids("look")
  assert later == [tok.obs_id, *tok.encode("look"), tok.act_id]
  # Specials are dropped on decode, so a whole turn decodes to its text.
  assert tok.decode(first + tok.encode("go") + [tok.eos_id]) == "be brieflookgo"


@pytest.mark.parametrize("text", TEXTS)
def test_hf_tokenizer_round_trips(tokenizer_dir, text):
  tok = HFTokenizer(str(tokenizer_dir))
  assert tok.decode(tok.encode(text)) == text


def test_hf_tokenizer_specials_and_templates(tokenizer_dir):
  tok = HFTokenizer(str(tokenizer_dir / "tokenizer.json"))
  assert tok.eos_id == tok._tok.token_to_id("<|im_end|>") and tok.pad_id == tok.eos_id
  assert tok.vocab_size == tok._tok.get_vocab_size(with_added_tokens=True)
  ids = tok.observation_ids("door?", prompt="sys text")
  assert ids.count(tok.eos_id) == 2  # the system turn and the user turn each close
  assert tok.decode(ids) == "system\nsys text\nuser\ndoor?\nassistant\n"
  assert tok.observation_ids("door?") == tok.encode(
      "<|im_start|>user\ndoor?<|im_end|>\n<|im_start|>assistant\n")


def test_hf_tokenizer_reads_tokenizer_config(tokenizer_dir, tmp_path):
  (tmp_path / "tokenizer.json").write_text((tokenizer_dir / "tokenizer.json").read_text())
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"eos_token": {"content": "<|endoftext|>"}, "pad_token": "<|im_start|>"}))
  tok = HFTokenizer(str(tmp_path))
  assert tok.eos_id == tok._tok.token_to_id("<|endoftext|>")
  assert tok.pad_id == tok._tok.token_to_id("<|im_start|>")


def test_hf_tokenizer_errors_name_the_problem(tokenizer_dir, tmp_path):
  with pytest.raises(ValueError, match="eos_token"):
    HFTokenizer(str(tokenizer_dir), eos_token="<|not_there|>")
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    HFTokenizer(str(tmp_path))
