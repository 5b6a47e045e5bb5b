"""Tiny GGUF files written the way llama.cpp's converter writes them (tests only).

A random HF Llama/Qwen2 model's weights go into a GGUF with llama.cpp's
names, its q/k row permutation (Llama only) and Q8_0 quantization of the
matrices, next to a small byte-level BPE vocabulary with two special tokens
and a chat template. transformers reads such a file with
`from_pretrained(dir, gguf_file=...)`: the outside oracle of the converter.
"""
from __future__ import annotations

import os

import numpy as np

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = (("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("Ġ", "s"))


def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's map of the 256 bytes to printable characters (byte-level BPE)."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
      list(range(ord("®"), ord("ÿ") + 1))
  out, extra = {}, 0
  for b in range(256):
    if b in keep:
      out[b] = chr(b)
    else:
      out[b] = chr(256 + extra)
      extra += 1
  return out


def vocabulary() -> tuple[list[str], list[int], list[str]]:
  """(tokens, llama.cpp token types, merges) of the toy byte-level BPE."""
  tokens = list(SPECIALS) + [bytes_to_unicode()[b] for b in range(256)] + ["".join(m) for m in MERGES]
  types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
  return tokens, types, [" ".join(m) for m in MERGES]


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """What llama.cpp's convert_hf_to_gguf does to Llama q/k rows (for its RoPE kernel)."""
  return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf_model, path: str, *, quantize: bool = True, chat_template: str | None = CHATML) -> str:
  """Writes `hf_model` (a transformers Llama/Qwen2 model) to `path` as llama.cpp would."""
  import gguf
  cfg = hf_model.config
  arch = cfg.model_type
  heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
  head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
  w = gguf.GGUFWriter(path, arch)
  w.add_name("tiny")
  w.add_block_count(cfg.num_hidden_layers)
  w.add_context_length(256)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(heads)
  w.add_head_count_kv(kv)
  w.add_key_length(head_dim)
  w.add_value_length(head_dim)
  w.add_rope_dimension_count(head_dim)
  w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None)
                             else cfg.rope_theta))
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_vocab_size(cfg.vocab_size)
  tokens, types, merges = vocabulary()
  assert len(tokens) == cfg.vocab_size, (len(tokens), cfg.vocab_size)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("default")
  w.add_token_list(tokens)
  w.add_token_types(types)
  w.add_token_merges(merges)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_pad_token_id(2)
  w.add_add_bos_token(False)
  if chat_template:
    w.add_chat_template(chat_template)
  names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
           "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
           "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
           "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
           "self_attn.v_proj.bias": "attn_v.bias", "mlp.gate_proj.weight": "ffn_gate.weight",
           "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
  top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
         "lm_head.weight": "output.weight"}
  for name, tensor in hf_model.state_dict().items():
    if name == "lm_head.weight" and cfg.tie_word_embeddings:
      continue
    arr = tensor.detach().float().numpy()
    if name in top:
      gname = top[name]
    else:
      _, _, layer, rest = name.split(".", 3)
      gname = f"blk.{layer}.{names[rest]}"
      if arch == "llama" and rest == "self_attn.q_proj.weight":
        arr = llama_cpp_permute(arr, heads)
      elif arch == "llama" and rest == "self_attn.k_proj.weight":
        arr = llama_cpp_permute(arr, kv)
    if quantize and arr.ndim == 2 and arr.shape[-1] % 32 == 0:
      q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
      w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
      w.add_tensor(gname, np.ascontiguousarray(arr, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def tiny_hf_model(family: str = "llama", seed: int = 0, **overrides):
  """A random transformers model sized for the toy vocabulary (dims multiples of 32 for Q8_0)."""
  import torch
  import transformers
  kw = dict(vocab_size=len(vocabulary()[0]), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, initializer_range=0.2,
            tie_word_embeddings=True, attn_implementation="eager")
  kw.update(overrides)
  torch.manual_seed(seed)
  cls, conf = ((transformers.LlamaForCausalLM, transformers.LlamaConfig) if family == "llama"
               else (transformers.Qwen2ForCausalLM, transformers.Qwen2Config))
  model = cls(conf(**kw))
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.3 * torch.randn_like(p))
  return model


def tiny_gguf(tmp_dir, family: str = "llama", **kw) -> str:
  os.makedirs(tmp_dir, exist_ok=True)
  return write_gguf(tiny_hf_model(family, **kw), os.path.join(str(tmp_dir), f"tiny-{family}.gguf"))
