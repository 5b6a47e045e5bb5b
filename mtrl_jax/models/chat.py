"""Chat templates and the token ids of a multi-turn session (token-in/token-out).

A pretrained chat model was trained on conversations rendered by its own
jinja template (`tokenizer_config.json` / `chat_template.jinja`). Here that
template is rendered the way transformers renders it (`ChatTemplate`: jinja2
sandbox, `trim_blocks`/`lstrip_blocks`, `raise_exception`, `tojson`,
`strftime_now`, the special tokens as variables), and `ChatFormat` turns an
episode into the ids the policy is prefilled with, turn by turn:

    turn 0:  ids of render([system: prompt, user: obs_0], add_generation_prompt)
    turn t:  ids of the text that render(the conversation so far + user: obs_t)
             adds after the text already in the KV cache

The policy's own tokens are never re-tokenized: the cache holds exactly the
ids it sampled (stop token included), the learner trains on exactly those
ids, and only the template's text AFTER them is encoded. Consequences:

  * An action that stopped on its end-of-turn token continues with what the
    template puts after that token (ChatML: a newline before the next
    `<|im_start|>`).
  * An action cut at the token budget has no end-of-turn token; the
    template's closing text (`<|im_end|>`, `<|eot_id|>`, ...) is then the
    start of the next prefill, so the next user turn never opens inside the
    assistant message. Those closing ids are prefilled (loss mask 0), not
    trained on.
  * A template's default system prompt appears exactly where the template
    puts it (SmolLM2: when the conversation has no system message).

Token-level equality with the whole conversation encoded at once also needs
the tokenizer to split at the template's seams (true of the real pairs:
ChatML with GPT-2-style pre-tokenizers, Llama 3's template with Llama 3's
newline-run split). Where it does not, the ids differ but the text is the
template's, and the ids are the ones the model saw: transformers encodes a
generation prompt alone at inference as well.

The check that makes this safe: the rendering of the whole conversation must
START WITH the text of the ids already in the cache. A template that renders a
sampled reply differently from how it was sampled breaks that: Llama-3 and
Gemma templates `| trim` a reply that starts or ends with whitespace (or was
cut at the budget right after a newline), Qwen3-style templates drop the
`<think>` block of past replies, and every template writes its own
end-of-turn token where a reply stopped on another stop id (a tokenizer eos
that is not the template's). Then no incremental encoding equals the
template's rendering: silently appending would train the policy on a context
its template never shows, and re-prefilling the rewritten history would put
ids in the sequence the policy never sampled. `ChatFormat.next_ids` raises
`BrokenPrefixError` naming the turn, the first differing text and the cause
(`cut_at_budget`, `stop_token`, `reply` or `history`); the rollout engines
catch it per session and end that session untrained (end_reason
'rewritten', rollout/engine.py), so one reply never ends the job.

A turn is closed with what the template writes after a reply
(`ChatFormat.closing_text`, e.g. '<end_of_turn>\n'): `end_of_turn_id` is its
first token, which the tokenizer adds to its stop ids and behaviour cloning
appends to demo actions, whatever the tokenizer's eos is.
"""
from __future__ import annotations

import datetime
import json
from typing import Callable, Mapping, NamedTuple, Sequence

# What `HFTokenizer` uses when a folder has no chat template: plain ChatML
# (Qwen2 / SmolLM style) without a default system prompt.
DEFAULT_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}")
PROMPT_ROLES = ("system", "user")


PROBE_REPLY = "mtrlprobe"  # a reply no template rewrites: no whitespace, no <think> block
CAUSES = ("cut_at_budget", "stop_token", "reply", "history")


class BrokenPrefixError(ValueError):
  """The template's rendering of the conversation does not extend the cached ids.

  turn: the turn whose prefill could not be built; cause: one of CAUSES (the
  last reply was cut at the budget / stopped on a stop id the template does
  not write / was rewritten by the template; or an earlier turn was); at: the
  first differing character.
  """

  def __init__(self, message: str, *, turn: int = -1, cause: str = "history", at: int = -1):
    super().__init__(message)
    self.turn, self.cause, self.at = turn, cause, at


class HistoryTurn(NamedTuple):
  """One finished turn as the cache holds it: the observation's text and
  prefill ids, and the action ids exactly as sampled (stop id included)."""
  observation: str
  obs_ids: Sequence[int]
  action_ids: Sequence[int]


def _template_env():
  try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
  except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError('chat templates need jinja2: pip install -e ".[hf]"') from e

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes HTML characters; transformers' does not.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  return env


class ChatTemplate:
  """A Hugging Face chat template, rendered as `apply_chat_template(tokenize=False)` does.

  special_tokens: the variables transformers passes besides the messages
  (`bos_token`, `eos_token`, `pad_token`, `unk_token`, ... as strings).
  """

  def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None):
    if not isinstance(source, str) or not source.strip():
      raise ValueError("chat_template must be a non-empty jinja string")
    self.source = source
    self.special_tokens = {k: v for k, v in dict(special_tokens or {}).items() if v is not None}
    self._compiled = _template_env().from_string(source)

  def render(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = False) -> str:
    msgs = [dict(m) for m in messages]
    return self._compiled.render(messages=msgs, tools=None, documents=None,
                                 add_generation_prompt=add_generation_prompt, **self.special_tokens)


def conversation(prompt: str | None, observations: Sequence[str], actions: Sequence[str],
                 prompt_role: str = "system") -> list[dict]:
  """The messages of an episode: the task prompt, then user observation /
  assistant action pairs (one more observation than actions, or as many).

  prompt_role 'system': the prompt is the system message (a template's
  default system prompt is then replaced); 'user': it opens the first user
  message and the template's default system prompt, if any, stays.
  """
  if prompt_role not in PROMPT_ROLES:
    raise ValueError(f"prompt_role must be one of {PROMPT_ROLES}, got {prompt_role!r}")
  if not len(actions) <= len(observations) <= len(actions) + 1:
    raise ValueError(f"{len(observations)} observations for {len(actions)} actions")
  msgs: list[dict] = []
  obs = list(observations)
  if prompt and prompt_role == "system":
    msgs.append({"role": "system", "content": prompt})
  elif prompt and obs:
    obs[0] = f"{prompt}\n\n{obs[0]}"
  for k, o in enumerate(obs):
    msgs.append({"role": "user", "content": o})
    if k < len(actions):
      msgs.append({"role": "assistant", "content": actions[k]})
  return msgs


class ChatFormat:
  """Turn-by-turn prefill ids of sessions under one chat template (see the module doc).

  Args:
    template: the model's ChatTemplate.
    encode: text -> ids, special-token markers in the text becoming their ids
      (as `apply_chat_template(tokenize=True)` encodes: no bos/eos added).
    decode: ids -> text with special tokens KEPT (the exact text of the ids).
    stop_ids: ids that end an action; a trailing one is not part of the
      message content the template sees (the template renders its own).
    prompt_role: where the env's task prompt goes ('system' or 'user').
  """

  def __init__(self, template: ChatTemplate, encode: Callable[[str], list[int]],
               decode: Callable[[Sequence[int]], str], stop_ids: Sequence[int], *, prompt_role: str = "system"):
    if prompt_role not in PROMPT_ROLES:
      raise ValueError(f"prompt_role must be one of {PROMPT_ROLES}, got {prompt_role!r}")
    self.template, self.encode, self.decode = template, encode, decode
    self.stop_ids = frozenset(int(i) for i in stop_ids)
    self.prompt_role = prompt_role

  def action_text(self, action_ids: Sequence[int]) -> str:
    """The assistant message content of an action: its ids' text, the stop token dropped."""
    ids = [int(i) for i in action_ids]
    if ids and ids[-1] in self.stop_ids:
      ids = ids[:-1]
    return self.decode(ids)

  def closing_text(self) -> str | None:
    """What the template writes right after an assistant reply ('<|im_end|>\\n',
    '<|eot_id|>', '<end_of_turn>\\n'); None when a probe conversation does not render."""
    try:
      text = self.template.render(conversation(None, ["hi"], [PROBE_REPLY]))
    except Exception:  # a template with demands the probe does not meet: no closing known
      return None
    i = text.rfind(PROBE_REPLY)
    return text[i + len(PROBE_REPLY):] if i >= 0 else None

  def end_of_turn_id(self, special_ids: Sequence[int]) -> int | None:
    """The id that closes an assistant turn under this template: the first id of
    `closing_text` when it is one of `special_ids` (else None: plain-text closings)."""
    closing = self.closing_text()
    ids = self.encode(closing) if closing else []
    return int(ids[0]) if ids and int(ids[0]) in set(int(i) for i in special_ids) else None

  def render(self, prompt: str | None, history: Sequence[HistoryTurn], observation: str | None) -> str:
    """The template's text of the conversation (with the generation prompt when
    it ends on a new observation)."""
    observations = [h.observation for h in history] + ([observation] if observation is not None else [])
    actions = [self.action_text(h.action_ids) for h in history]
    msgs = conversation(prompt, observations, actions, self.prompt_role)
    return self.template.render(msgs, add_generation_prompt=observation is not None)

  def first_ids(self, observation: str, prompt: str | None) -> list[int]:
    return list(self.encode(self.render(prompt, (), observation)))

  def next_ids(self, prompt: str | None, history: Sequence[HistoryTurn], observation: str) -> list[int]:
    """Ids to prefill before the policy answers `observation`, after `history`.

    Raises BrokenPrefixError when the rendering does not start with the text
    of the cached ids (the template rewrote an earlier turn).
    """
    if not history:
      return self.first_ids(observation, prompt)
    cached = self.decode([int(i) for h in history for part in (h.obs_ids, h.action_ids) for i in part])
    full = self.render(prompt, history, observation)
    if not full.startswith(cached):
      raise self._broken(history, cached, full)
    return list(self.encode(full[len(cached):]))

  def _broken(self, history: Sequence[HistoryTurn], cached: str, full: str) -> BrokenPrefixError:
    """The error for a rendering that does not extend the cache, with its cause."""
    k = len(history)
    at = next((i for i, (a, b) in enumerate(zip(full, cached)) if a != b), min(len(full), len(cached)))
    ids = [int(i) for h in history for part in (h.obs_ids, h.action_ids) for i in part]
    last = [int(i) for i in history[-1].action_ids]
    last_start = len(self.decode(ids[:len(ids) - len(last)]))
    stopped = bool(last) and last[-1] in self.stop_ids
    content_end = len(self.decode(ids[:len(ids) - 1])) if stopped else len(cached)
    where = f"At character {at}: cache has {cached[at:at + 40]!r}, template renders {full[at:at + 40]!r}."
    if at < last_start:
      cause = "history"
      what = (f"turn {k}: the chat template's rendering of the conversation does not extend the tokens "
              f"already in the cache (it rewrites an earlier turn, e.g. strips a <think> block or trims "
              f"whitespace).")
    elif not stopped and at >= last_start + len(cached[last_start:].rstrip()):
      # Only where the cut left whitespace at the reply's end: a cut reply that starts with a
      # space is rewritten for that space, as a stopped one would be.
      cause = "cut_at_budget"
      what = (f"turn {k}: the action of turn {k - 1} was cut at the token budget (config rollout.turn_budget; "
              f"no end-of-turn token) after {cached[last_start:][-20:]!r}, and the chat template closes a reply "
              f"cut there differently (it trims the whitespace the cut left at its end).")
    elif stopped and at >= content_end:
      cause = "stop_token"
      what = (f"turn {k}: the action of turn {k - 1} stopped on {self.decode(last[-1:])!r}, a stop id the chat "
              f"template does not write: it closes a reply with {self.closing_text()!r}.")
    else:
      cause = "reply"
      what = (f"turn {k}: the chat template rewrites the reply of turn {k - 1} (it trims whitespace around "
              f"it or strips a <think> block).")
    return BrokenPrefixError(
        f"{what} {where} Token-in/token-out cannot continue this session: the rollout engines end it "
        f"untrained (end_reason 'rewritten'); a template that keeps replies as generated avoids it "
        f"(config chat.template / HFTokenizer(chat_template=...)).", turn=k, cause=cause, at=at)
