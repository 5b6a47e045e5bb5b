"""A real model shape with long sessions: Qwen2.5-0.5B, flash-style attention, remat, scan, chunked vocab.

The shape of Qwen2.5-0.5B (24 layers, d=896, 14 heads / 2 kv heads, vocab
151,936; `model.dtype="auto"`: bf16 compute on GPU/TPU, fp32 on CPU, fp32
weights and optimiser state everywhere) with every long-session switch on:
`model.attention=auto` (cuDNN flash on GPU, Pallas splash on TPU, blockwise
online softmax on CPU), `model.remat=full` (each block recomputed in the
backward pass), `model.scan_layers=True` (one compiled block for all 24) and
`model.logits_chunk` (the [B, T, vocab] logits never exist whole). Sessions
may grow to `rollout.context_cap` tokens: `memory` with 16 distractor turns
and a per-turn budget of 256 new tokens.

Commands:
  # a TPU VM or GPU machine, random init (byte tokenizer):
  python -m mtrl_jax.main --config=configs/scale.py --workdir=/tmp/scale
  # from a local Hugging Face folder (its tokenizer.json and weights):
  python -m mtrl_jax.main --config=configs/scale.py --config.hf_dir=/path/to/Qwen2.5-0.5B --workdir=...
  # the same switches at a CPU smoke size (every stage, a few minutes on 2 cores):
  python -m mtrl_jax.main --config=configs/scale.py:runlocal=true --workdir=/tmp/scale_local
Memory and speed of the RL update at this shape: benchmarks/learner.py and
benchmarks/RESULTS.md.
"""
from configs.common import default_config, shrink
from mtrl_jax.config_args import parse_args

QWEN2_5_0_5B = dict(vocab_size=151_936, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64,
                    mlp_dim=4864, rope_theta=1_000_000.0, norm_eps=1e-6, qkv_bias=True,
                    tie_embeddings=True, dtype="auto", param_dtype="float32")
LONG_SESSIONS = dict(attention="auto", remat="full", scan_layers=True, logits_chunk=1024)


def get_config(arg=None):
  a = parse_args(arg, {"length": 16, "runlocal": False})
  c = default_config(a["length"])
  c.model.update({**QWEN2_5_0_5B, **LONG_SESSIONS})
  c.critic.kind = "separate"  # the RL update then carries two 0.5B networks, as benchmarked
  c.rl.estimator = "ms_grpo"
  c.rl.lr = 1e-6
  c.rl.critic_lr = 5e-6
  c.sft.lr = 1e-5
  c.sft.batch_size = 8
  c.rl.tasks_per_update = 4
  c.rl.group_size = 8
  c.rl.minibatches = 4
  c.rollout.turn_budget = 256
  c.rollout.context_cap = 32_768
  if a["runlocal"]:
    c = shrink(c)
    # Small widths, same switches: blockwise attention, remat, scan and chunked
    # log-probs all run on the CPU path.
    c.model.update(dict(vocab_size=264, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
                        mlp_dim=192, dtype="float32", attention="blockwise", logits_chunk=64))
    c.rollout.turn_budget = 8
    c.rollout.context_cap = 512
    c.sft.lr = 3e-3
    c.rl.lr = 5e-4
    c.rl.critic_lr = 1e-3
  return c
