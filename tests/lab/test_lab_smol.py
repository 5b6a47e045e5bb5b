"""The lab on a real pretrained model (configs/lab_smol.py): its config, and (slow) the
whole lab job on a 2-layer conversion of SmolLM2 with its own chat template."""
import json
import os
import subprocess
import sys

import pytest

from mtrl_jax import config as config_lib
from mtrl_jax.lab.variants import lab_estimators

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from configs import lab_smol  # noqa: E402


@pytest.fixture()
def hf_dir(tmp_path):
  (tmp_path / "config.json").write_text("{}")  # validate() only checks the folder has one
  return str(tmp_path)


def test_lab_smol_config_validates_and_scores_only_what_it_can(hf_dir):
  """Catches the byte model's learning rates reaching the pretrained policy (validate's
  guard refuses them) and critic or progress rows requested of a critic-free run (the lab
  would drop them silently); critic=true adds the stage and the critic rows."""
  c = lab_smol.get_config(f"hf_dir={hf_dir}")
  config_lib.validate(c, num_devices=1)
  assert c.hf_dir == hf_dir and c.env.name == "bifurcation" and c.env.kwargs.style == "natural"
  assert tuple(c.stages) == ("demos", "sft") and c.critic.kind == "none"
  table = lab_estimators(tuple(c.lab.estimators))
  assert set(table) == set(lab_smol.NO_CRITIC) and all(e[2] is None for e in table.values())
  with_critic = lab_smol.get_config(f"hf_dir={hf_dir},critic=true,length=8")
  config_lib.validate(with_critic, num_devices=1)
  assert "value_pretrain" in with_critic.stages and with_critic.critic.kind == "separate"
  assert tuple(with_critic.lab.estimators) == ()  # every row, critic ones included
  # The longest history (prompt + 10 turns of bifurcation h8) plus one action fits.
  assert with_critic.rollout.context_cap >= 256 + 48 * 10
  with pytest.raises(ValueError, match="env='keydoor'"):
    lab_smol.get_config(f"hf_dir={hf_dir},env=keydoor")


@pytest.mark.slow
def test_lab_runs_on_smollm2_through_its_chat_template(smollm2_2layer, tmp_path):
  """The lab job end to end on SmolLM2's tokenizer and template (2 layers, smoke size):
  every critic-free estimator is scored, the gigpo step groups are counted, and the
  continuations decoded tokens. Catches the chat path of continue_from failing (it
  raised NotImplementedError before) or a row lost on the way to result.json."""
  work = tmp_path / "lab"
  # One CPU device (not the tests' 8 fake ones: 8 made this job 7x slower) and 2 behaviour-cloning
  # steps: the lab's path through the template is under test here, not the warm start.
  env = {**os.environ, "PYTHONPATH": ROOT, "XLA_FLAGS": "--xla_backend_optimization_level=0"}
  out = subprocess.run([sys.executable, "-m", "mtrl_jax.lab.credit_accuracy",
                        f"--config={ROOT}/configs/lab_smol.py:hf_dir={smollm2_2layer},runlocal=true",
                        f"--workdir={work}", "--config.sft.steps=2"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads((work / "lab" / "result.json").read_text())
  assert set(result["estimators"]) == set(lab_smol.NO_CRITIC)
  assert result["step_groups"]["keyed"] > 0
  assert result["tokens"]["continuations"] > 0 and result["sessions"] > 0
