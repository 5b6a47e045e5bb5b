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


# Gemma's layout, shortened: the tokenizer's eos is <eos>, the template closes every turn with <end_of_turn>.
END_OF_TURN_TEMPLATE = (
    "{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\\n' + message['content'] + "
    "'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")


def test_the_templates_end_of_turn_is_a_stop_id(tokenizer_dir, tmp_path):
  """A folder whose eos (<eos>) is not what its template writes after a reply (<end_of_turn>): the
  end-of-turn id is found, and both the sampler's stop ids and the chat format's include it, so a
  rollout stops where the template closes a turn (and a reply stopped on it renders as sampled).
  Breaks checked: the end-of-turn id not added to the stop ids (models/tokenizer.py), or added
  without updating the chat format's copy (`self.chat.stop_ids`): each fails."""
  import tokenizers
  tok = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t in ("<eos>", "<start_of_turn>", "<end_of_turn>")])
  tok.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"eos_token": "<eos>", "chat_template": END_OF_TURN_TEMPLATE}))
  hf = HFTokenizer(str(tmp_path))
  eos, eot = tok.token_to_id("<eos>"), tok.token_to_id("<end_of_turn>")
  assert (hf.eos_id, hf.end_of_turn_id) == (eos, eot)
  assert hf.stop_ids == (eos, eot) and hf.chat.stop_ids == {eos, eot}
