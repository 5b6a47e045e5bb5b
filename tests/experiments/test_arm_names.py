"""One name, one estimator variant: a name both the lab (mtrl_jax/lab/variants.py) and the study
(configs/study.py ARMS) use means the same registry estimator with the same hyper-parameters."""
from configs import study
from experiments.study import plan as study_runner
from mtrl_jax.credit import registry
from mtrl_jax.lab.variants import lab_estimators


def _resolved(reg: str, hp: dict) -> tuple:
  """(registry name, every hyper-parameter with its default filled in): {} and the defaults spelled
  out are the same variant."""
  return reg, {**registry.hparam_defaults(reg), **hp}


def test_shared_names_mean_the_same_variant():
  """Catches a name reused for another variant: the study's VAPO arm at alpha 2 called
  `gae_length_adaptive`, which in the lab is alpha 0.05 (gae's default), or the study's return-to-go
  at gamma 0.9 called `return_to_go` (gamma 1 in the lab). Compares with defaults filled in, so
  spelling out a default on one side only is no clash. Also checks a critic is read on both sides
  or on neither ('separate' in the study, 'mc'/'coupled' in the lab)."""
  lab = lab_estimators()
  shared = sorted(set(lab) & set(study.ARMS))
  assert {"gae_lambda0.95", "gae_lambda1", "gae_decoupled", "gae_length_adaptive_alpha2", "ms_grpo"} <= set(shared)
  for name in shared:
    reg_l, hp_l, critic_l = lab[name]
    reg_s, hp_s, critic_s = study.ARMS[name]
    assert _resolved(reg_l, hp_l) == _resolved(reg_s, hp_s), name
    assert (critic_l in ("mc", "coupled")) == (critic_s == "separate"), name


def test_the_length_adaptive_names_say_their_alpha():
  """`gae_length_adaptive` is alpha 0.05 (the estimator's default: the lab's row), the study's arm is
  `gae_length_adaptive_alpha2` and a critic arm of the study runner. Catches the rename undone on one
  side (e.g. CRITIC_ARMS still naming `gae_length_adaptive`: its runs would start without a critic)."""
  lab = lab_estimators()
  assert registry.hparam_defaults("gae")["alpha"] == 0.05
  assert _resolved(*lab["gae_length_adaptive"][:2])[1]["alpha"] == 0.05
  assert study.ARMS["gae_length_adaptive_alpha2"][1]["alpha"] == 2.0
  assert "gae_length_adaptive" not in study.ARMS
  assert "gae_length_adaptive_alpha2" in study_runner.CRITIC_ARMS
  assert study_runner.CRITIC_ARMS <= set(study.ARMS)
  assert {a for a, (_, _, critic) in study.ARMS.items() if critic == "separate"} == study_runner.CRITIC_ARMS
