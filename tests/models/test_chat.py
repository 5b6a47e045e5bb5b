"""Chat templates, token-in/token-out: transformers' apply_chat_template is the oracle.

Every template runs on the real SmolLM2 byte-level BPE (the 2-block fixture's
tokenizer.json); templates whose markers SmolLM2 lacks (Llama 3, Gemma) get
them added as special tokens, as their own vocabularies have them.
"""
import json
import os
import shutil

import pytest

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from mtrl_jax.models import chat  # noqa: E402
from mtrl_jax.models.chat import BrokenPrefixError, HistoryTurn  # noqa: E402
from mtrl_jax.models.tokenizer import HFTokenizer, continuation_ids  # noqa: E402

LLAMA3 = (  # Meta-Llama-3-8B-Instruct's template, verbatim
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GEMMA = (  # Gemma-2 style: no system role (folded into the first user turn), 'model' turns, trim
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = "
    "messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}{% else %}"
    "{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}"
    "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
    "(first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
THINK = (  # Qwen3 style: earlier assistant turns lose their <think> block
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Llama 3's pre-tokenizer: newline runs are one piece whatever follows, so the
# generation prompt's "\n\n" is split the same alone and before the reply.
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")

# name -> (template or None for the folder's own, extra special tokens, bos, eos, generation eos ids)
TEMPLATES = {
    "smollm2": (None, (), "<|im_start|>", "<|im_end|>", None),  # ChatML + a default system prompt
    "chatml": (chat.DEFAULT_CHATML, (), "<|im_start|>", "<|im_end|>", None),
    "llama3": (LLAMA3, ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>"), "<|begin_of_text|>", "<|eot_id|>", ("<|end_of_text|>", "<|eot_id|>")),
    "gemma": (GEMMA, ("<bos>", "<start_of_turn>", "<end_of_turn>"), "<bos>", "<end_of_turn>", None),
    "think": (THINK, (), "<|im_start|>", "<|im_end|>", None),
}

# An episode: observations (one more than actions) and each action as (text, "stop" | cut after k tokens).
EPISODE = [("peek or skip?", ("peek", "stop")), ("code 7. Say q.", ("I will say q now", 2)),
           ("Say m.", ("m", "stop")), ("What was the code?", ("The code is 7", 3))]
LAST_OBS = "Right. Thanks!"


def _folder(base_dir, out_dir, name, llama3_split=True):
  template, extra, bos, eos, gen_eos = TEMPLATES[name]
  os.makedirs(out_dir, exist_ok=True)
  tok = tokenizers.Tokenizer.from_file(os.path.join(base_dir, "tokenizer.json"))
  if name == "llama3" and llama3_split:
    pt = tokenizers.pre_tokenizers
    tok.pre_tokenizer = pt.Sequence([pt.Split(tokenizers.Regex(LLAMA3_SPLIT), behavior="isolated"),
                                     pt.ByteLevel(add_prefix_space=False, use_regex=False)])
  if extra:
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in extra])
  tok.save(os.path.join(out_dir, "tokenizer.json"))
  cfg = json.load(open(os.path.join(base_dir, "tokenizer_config.json")))
  cfg.update(bos_token=bos, eos_token=eos, pad_token=eos)
  if template is not None:
    cfg["chat_template"] = template
  json.dump(cfg, open(os.path.join(out_dir, "tokenizer_config.json"), "w"))
  if template is None:
    shutil.copy(os.path.join(base_dir, "chat_template.jinja"), out_dir)
  gen = {"eos_token_id": [tok.token_to_id(t) for t in gen_eos] if gen_eos else tok.token_to_id(eos)}
  json.dump(gen, open(os.path.join(out_dir, "generation_config.json"), "w"))
  return out_dir


@pytest.fixture(scope="module")
def folders(smollm2_2layer, tmp_path_factory):
  root = tmp_path_factory.mktemp("templates")
  return {name: _folder(smollm2_2layer, str(root / name), name) for name in TEMPLATES}


def _oracle(folder):
  return transformers.AutoTokenizer.from_pretrained(folder)


def _play(tok, prompt, episode, last_obs, prompt_role="system"):
  """Incremental ids of an episode whose actions are the canonical ids of their
  text (plus the stop id, or cut after k ids); and its messages for the oracle."""
  ids, history, texts = [], [], []
  obs_ids = tok.observation_ids(episode[0][0], prompt)
  for k, (obs, (text, how)) in enumerate(episode):
    if k:
      obs_ids = continuation_ids(tok, prompt, history, obs)
      # After a cut action the prefill closes it with the end-of-turn id; after
      # a stopped one that id is already in the cache.
      assert (obs_ids[0] == tok.eos_id) == (episode[k - 1][1][1] != "stop"), (k, obs_ids[:3])
    act = tok.encode(text) + [tok.eos_id] if how == "stop" else tok.encode(text)[:how]
    texts.append(text if how == "stop" else tok.decode(act, skip_special_tokens=False))
    ids += obs_ids + act
    history.append(HistoryTurn(obs, obs_ids, act))
  ids += continuation_ids(tok, prompt, history, last_obs)
  msgs = chat.conversation(prompt, [o for o, _ in episode] + [last_obs], texts, prompt_role)
  return ids, msgs


@pytest.mark.parametrize("name", ["smollm2", "chatml", "llama3", "gemma", "think"])
@pytest.mark.parametrize("prompt", [None, "You play a memory game. Answer in one word."])
def test_incremental_ids_equal_the_whole_conversation(folders, name, prompt):
  """Per-turn prefills + the sampled ids == apply_chat_template(whole conversation).

  Covers actions that stopped on the end-of-turn id (ChatML's newline after
  <|im_end|> comes in the next prefill), actions cut at the budget (the next
  prefill starts with the template's closing token), the bos of Llama 3 /
  Gemma, Gemma's system prompt folded into the first user turn, and SmolLM2's
  default system prompt (present exactly when there is no env prompt).
  Break checked: the cache text without the stop token (delta repeats
  <|im_end|>); the first turn encoded with the byte-style layout; a cut
  action left unclosed (old HFTokenizer).
  """
  tok = HFTokenizer(folders[name])
  ids, msgs = _play(tok, prompt, EPISODE, LAST_OBS)
  want = _oracle(folders[name]).apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
  want = list(want["input_ids"] if hasattr(want, "keys") else want)
  assert ids == want, (tok.decode(ids, skip_special_tokens=False), tok.decode(want, skip_special_tokens=False))
  text = tok.decode(ids, skip_special_tokens=False)
  if name == "smollm2":
    assert ("You are a helpful AI assistant named SmolLM" in text) == (prompt is None)


def test_text_matches_even_where_the_tokenizer_splits_differently(smollm2_2layer, tmp_path):
  """Llama 3's template on SmolLM2's GPT-2 pre-tokenizer: the generation
  prompt's trailing "\n\n" is one id alone but two before a reply, so the
  ids of the whole conversation re-tokenized differ from the ones the policy
  was prefilled with (at inference too: transformers encodes the generation
  prompt alone). The TEXT is still exactly the template's rendering."""
  folder = _folder(smollm2_2layer, str(tmp_path / "l3"), "llama3", llama3_split=False)
  tok = HFTokenizer(folder)
  ids, msgs = _play(tok, None, EPISODE, LAST_OBS)
  oracle = _oracle(folder)
  assert tok.decode(ids, skip_special_tokens=False) == oracle.apply_chat_template(
      msgs, tokenize=False, add_generation_prompt=True)
  assert ids != list(oracle.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)["input_ids"])


def test_prompt_as_user_keeps_the_default_system_prompt(folders):
  tok = HFTokenizer(folders["smollm2"], prompt_role="user")
  ids, msgs = _play(tok, "Rules: say peek.", EPISODE[:2], LAST_OBS, prompt_role="user")
  assert msgs[0] == {"role": "user", "content": "Rules: say peek.\n\npeek or skip?"}
  want = _oracle(folders["smollm2"]).apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
  assert ids == list(want["input_ids"])
  assert "named SmolLM" in tok.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_rendering_equals_transformers(folders, name):
  """ChatTemplate.render == apply_chat_template(tokenize=False), with and
  without a system message and the generation prompt."""
  tok = HFTokenizer(folders[name])
  oracle = _oracle(folders[name])
  for prompt in (None, "sys"):
    msgs = chat.conversation(prompt, ["a", " b ", "c\n"], ["x", " y"])
    for gen in (False, True):
      assert tok.chat.template.render(msgs, add_generation_prompt=gen) == oracle.apply_chat_template(
          msgs, tokenize=False, add_generation_prompt=gen)


def test_template_that_strips_think_blocks_is_detected(folders):
  """History rewriting: the second prefill cannot extend the cache (the
  engines end such a session: tests/rollout/test_rewritten_replies.py). Break
  checked: without the prefix check the engine would prefill the rest of the
  rendering after a prefix that is not the cache's (ids silently wrong)."""
  tok = HFTokenizer(folders["think"])
  episode = [("peek or skip?", ("<think>peeking costs little</think>peek", "stop")), ("Say q.", ("q", "stop"))]
  with pytest.raises(BrokenPrefixError, match=r"turn 1: .*rewrites the reply of turn 0.*peeking costs") as e:
    _play(tok, None, episode, LAST_OBS)
  assert e.value.cause == "reply" and e.value.turn == 1
  # Without a think block the same template keeps every prefix.
  _play(tok, None, [("peek or skip?", ("peek", "stop"))], LAST_OBS)


def test_trimming_template_with_whitespace_action_is_detected(folders):
  """Llama 3 trims message content: a sampled ' peek\\n' is rendered 'peek'."""
  tok = HFTokenizer(folders["llama3"])
  with pytest.raises(BrokenPrefixError, match="turn 1") as e:
    _play(tok, "p", [("peek or skip?", (" peek\n", "stop"))], LAST_OBS)
  assert e.value.cause == "reply"


def test_stop_ids_come_from_generation_config(folders, tmp_path):
  tok = HFTokenizer(folders["llama3"])
  assert tok.stop_ids == (tok._id("<|end_of_text|>", "x"), tok._id("<|eot_id|>", "x"))
  assert tok.eos_id == tok._id("<|eot_id|>", "x")
  # Stopping on either stop id drops it from the message content.
  for stop in tok.stop_ids:
    assert tok.chat.action_text(tok.encode("peek") + [stop]) == "peek"
  # No generation_config: the eos token alone.
  shutil.copytree(folders["chatml"], tmp_path / "nogen")
  os.remove(tmp_path / "nogen" / "generation_config.json")
  assert HFTokenizer(str(tmp_path / "nogen")).stop_ids == (2,)


def test_template_override_and_default(folders, tmp_path):
  """chat_template= replaces the folder's; a folder without one gets plain ChatML."""
  tok = HFTokenizer(folders["smollm2"], chat_template=chat.DEFAULT_CHATML)
  assert "SmolLM" not in tok.decode(tok.observation_ids("hi"), skip_special_tokens=False)
  path = tmp_path / "t.jinja"
  path.write_text(THINK)
  assert HFTokenizer(folders["smollm2"], chat_template=str(path)).chat_template == THINK
  bare = tmp_path / "bare"
  bare.mkdir()
  shutil.copy(os.path.join(folders["chatml"], "tokenizer.json"), bare)
  tok = HFTokenizer(str(bare))
  assert not tok.has_own_template and tok.chat_template == chat.DEFAULT_CHATML
  with pytest.raises(ValueError, match="prompt_role"):
    HFTokenizer(folders["chatml"], prompt_role="assistant")


def test_byte_tokenizer_layout_is_unchanged():
  """continuation_ids falls back to the byte layout (no history needed)."""
  from mtrl_jax.models.tokenizer import ByteTokenizer
  tok = ByteTokenizer()
  first = continuation_ids(tok, "p", [], "o")
  assert first == tok.observation_ids("o", "p")
  assert continuation_ids(tok, "p", [HistoryTurn("o", first, [9, 2])], "o2") == tok.observation_ids("o2")
