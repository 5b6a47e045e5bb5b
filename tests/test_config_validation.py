"""Config validation: env kwargs per env, the command line, pretrained learning rates."""
import os

import pytest
from absl import flags
from ml_collections import config_flags

from mtrl_jax import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def hf_dir(tmp_path):
  """A folder that passes validate's hf_dir check (validation never loads it)."""
  (tmp_path / "config.json").write_text("{}")
  return str(tmp_path)


def parse(*argv):
  """The config exactly as `python -m mtrl_jax.main ...` builds it (locked, overrides applied)."""
  fv = flags.FlagValues()
  argv = ["main", *argv]
  # sys_argv: config_flags defines the override flags it finds there.
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True, sys_argv=argv)
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    fv(argv)
  finally:
    os.chdir(cwd)
  return fv.config


def test_env_kwargs_for_fills_every_argument():
  kw = config_lib.env_kwargs_for("keydoor", size=7)
  assert kw.to_dict() == {"size": 7, "corridor": False, "view": None, "max_turns": None, "style": "terse"}
  with pytest.raises(ValueError, match="lenght"):
    config_lib.env_kwargs_for("memory", lenght=3)


def test_textarena_game_from_the_command_line():
  """Issue 22: `--config.env.kwargs.game=...` raised AttributeError (no such key
  in the locked kwargs). Break checked: build() without env_kwargs_for."""
  pytest.importorskip("textarena")
  c = parse("--config=configs/ms_grpo.py:env=textarena", "--config.env.kwargs.game=Sokoban-v0",
            "--config.env.kwargs.max_turns=9")
  assert (c.env.name, c.env.kwargs.game, c.env.kwargs.max_turns) == ("textarena", "Sokoban-v0", 9)
  config_lib.validate(c)
  from mtrl_jax.envs import registry
  env = registry.make(c.env.name, **dict(c.env.kwargs))
  assert env.kind == "Sokoban" and env.max_turns == 9


def test_env_name_alone_names_the_leftover_kwarg():
  """--config.env.name=textarena over memory's kwargs: the error names the
  field that does not fit and the way to choose an env."""
  pytest.importorskip("textarena")
  c = parse("--config=configs/ms_grpo.py", "--config.env.name=textarena")
  with pytest.raises(ValueError, match=r"config\.env\.kwargs\.code_alphabet: not an argument of env 'textarena'.*"
                                       r"configs/smol.py:env=textarena"):
    config_lib.validate(c)


def test_bad_env_value_names_the_kwarg():
  c = parse("--config=configs/default.py", "--config.env.kwargs.length=-1")
  with pytest.raises(ValueError, match=r"config\.env\.kwargs\.length: memory: length must be >= 0"):
    config_lib.validate(c)
  c = parse("--config=configs/smol.py", "--config.env.kwargs.style=english", "--config.hf_dir=/nonexistent")
  with pytest.raises(ValueError, match=r"config\.env\.kwargs\.style: memory: style must be one of"):
    config_lib.validate(c)


@pytest.mark.parametrize("field,value", [("sft.lr", 3e-3), ("rl.lr", 5e-4), ("rl.critic_lr", 1e-3)])
def test_pretrained_checkpoint_refuses_tiny_model_learning_rates(hf_dir, field, value):
  """Issue 22: sft.lr 3e-3 wrecked SmolLM2 in 4 steps. Break checked: the
  guard skipped (validate passes silently)."""
  c = parse("--config=configs/smol.py", f"--config.{field}={value}", f"--config.hf_dir={hf_dir}")
  with pytest.raises(ValueError, match=rf"config\.{field}: {value:g} is a learning rate for the tiny"):
    config_lib.validate(c)
  with c.unlocked():
    c.lr_guard = False
  config_lib.validate(c)
  # The byte model keeps its own rates.
  config_lib.validate(parse("--config=configs/default.py"))


def test_smol_config_validates_and_names_its_model(hf_dir, tmp_path):
  c = parse("--config=configs/smol.py", f"--config.hf_dir={hf_dir}")
  config_lib.validate(c)
  assert c.hf_dir and c.model.remat != "none" and c.model.logits_chunk > 0
  assert c.env.kwargs.style == "natural" and c.sft.lr <= 1e-4 and c.rl.lr <= 1e-5
  with pytest.raises(ValueError, match=r"config\.chat\.prompt_role"):
    config_lib.validate(parse("--config=configs/smol.py", "--config.chat.prompt_role=assistant",
                              f"--config.hf_dir={hf_dir}"))
  missing = str(tmp_path / "nowhere")
  with pytest.raises(ValueError, match=r"config\.hf_dir: no config.json .*convert --gguf smollm2"):
    config_lib.validate(parse("--config=configs/smol.py", f"--config.hf_dir={missing}"))


@pytest.mark.parametrize("kind,rank", [("lora", 4), ("head", 4)])
def test_value_pretraining_refuses_lora_critics_it_cannot_fit(kind, rank):
  """train/value_pretrain.py fits a full critic; with LoRA it would train the wrong
  parameters, so its stage refuses to start, naming the field (a separate critic
  beside a LoRA policy is fine)."""
  from mtrl_jax.train.value_pretrain import check_supported
  c = config_lib.base_config()
  c.critic.kind, c.model.lora.rank = kind, rank
  with pytest.raises(ValueError, match="config.value_pretrain.enabled"):
    check_supported(c)
  c.critic.kind = "separate"
  check_supported(c)


@pytest.mark.parametrize("field,value", [("max_seconds", -1.0), ("window", 0), ("patience", -1),
                                         ("min_delta", -0.1), ("stop_at_ratio", -0.2), ("stop_at_ratio", 3.0),
                                         ("steps", 0)])
def test_value_pretraining_stopping_fields_are_validated_by_name(field, value):
  """Every field of value pretraining's stopping rule (train/vp_stop.py) is refused out of range with
  an error naming it; the defaults validate (a wrong type, e.g. window=2.5, the locked ConfigDict
  refuses itself). Break checked: the window check removed (window 0 then smooths over no round:
  validate passes, this fails)."""
  c = config_lib.base_config()
  config_lib.validate(c)
  with c.unlocked():
    c.value_pretrain[field] = value
  with pytest.raises(ValueError, match=f"config.value_pretrain.{field}"):
    config_lib.validate(c)


def test_value_pretraining_stopping_fields_from_the_command_line():
  """Declared with defaults: settable from the command line, and a typo fails before any compute."""
  c = parse("--config=configs/default.py", "--config.value_pretrain.stop_at_ratio=0.45",
            "--config.value_pretrain.max_seconds=600")
  assert (c.value_pretrain.stop_at_ratio, c.value_pretrain.max_seconds) == (0.45, 600.0)
  with pytest.raises(Exception, match="stop_at_ration"):
    parse("--config=configs/default.py", "--config.value_pretrain.stop_at_ration=0.45")
