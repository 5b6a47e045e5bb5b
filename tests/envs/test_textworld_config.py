"""configs/textworld.py: its variants (byte, smol, lab, runlocal) and their sizes (no pool is built)."""
import pytest

from configs import textworld as tw_config


def test_the_byte_config_fits_its_sessions_and_evaluates_held_out_games():
  """Break checked: a context cap of 64 x max_turns without the prompt's 128 (or cooking's 64 a turn)
  fails the fit; eval.seed_offset outside the held-out range fails the last line."""
  for arg, kind in (("", "coin_collector"), ("level=20", "coin_collector"), ("kind=cooking", "cooking")):
    c = tw_config.get_config(arg)
    kw = c.env.kwargs
    assert c.env.name == "textworld" and kw.kind == kind and kw.style == "terse" and not kw.list_commands
    per_turn = kw.terse_chars + 32 if kind == "cooking" else 64  # a turn: its view, the command, 3 markers
    assert c.rollout.context_cap >= 100 + per_turn * kw.max_turns * 0.85, (arg, c.rollout.context_cap)
    from mtrl_jax.envs.textworld import HELD_OUT_SEEDS
    assert c.eval.seed_offset in HELD_OUT_SEEDS and c.eval.tasks == 64
  assert tw_config.get_config("level=20").env.kwargs.max_turns == 32


def test_smol_lab_and_runlocal_variants():
  """Break checked: model=smol without list_commands (the chat model never sees what it may type) or
  without the continuous rows (the memory bound) fails; lab=true without its critic fails."""
  s = tw_config.get_config("model=smol")
  assert s.env.kwargs.style == "natural" and s.env.kwargs.list_commands and s.hf_dir
  assert s.rollout.continuous and s.rollout.rows == 16 and s.demos.quality == 1.0 and s.env.kwargs.max_turns == 8
  lab = tw_config.get_config("lab=true,tasks=4,k=2")
  assert lab.critic.kind == "separate" and lab.stages == ("demos", "sft", "value_pretrain")
  assert lab.lab.tasks == 4 and lab.lab.continuations == 2
  small = tw_config.get_config("runlocal=true")
  assert (small.env.kwargs.games, small.env.kwargs.eval_games, small.rl.steps) == (8, 4, 3)


@pytest.mark.parametrize("arg,match", [("kind=zork", "kind='zork'"), ("model=gpt", "model='gpt'"),
                                       ("context=window", "context='window'"), ("hf_dir=/x", "only model=smol")])
def test_bad_arguments_name_themselves(arg, match):
  with pytest.raises(ValueError, match=match):
    tw_config.get_config(arg)
