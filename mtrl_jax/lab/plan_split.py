"""The lab's walkthrough split: how each estimator credits the turns a task's walkthrough needs.

Envs with a planner mark each turn `info["on_plan"]` (TextWorld: the command was the first of
textworld's shortest winning plan at the state it was played in). On those turns the true
advantage is mostly positive (the planned command keeps the win in reach at the least cost) and
off them mostly negative or zero (a detour, an invalid command). For each estimator this gives,
on the on-plan and the off-plan turns apart: sign agreement with A* on the significant items
(count and 95% Wilson interval, scores.py), the share of turns it credits (estimate > 0), and
its mean estimate and the mean A* in units of their batch RMS (as the early-exit split).
"""
from __future__ import annotations

import numpy as np

from mtrl_jax.lab import scores


def plan_mask(sessions) -> np.ndarray | None:
  """Per (session, turn) item: did the turn play the planned command? None when no turn says."""
  flags = [t.info.get("on_plan") for s in sessions for t in s.turns]
  if all(f is None for f in flags):
    return None
  return np.array([bool(f) for f in flags])


def plan_scores(est_i, a_star_i, se_i, plan_i) -> dict:
  """The split's numbers for one estimator (see the module docstring)."""
  rms_e, rms_a = scores._rms(est_i), scores._rms(a_star_i)
  out = {}
  for label, m in (("on_plan", plan_i), ("off_plan", ~plan_i)):
    a = scores.sign_agreement(est_i, a_star_i, se_i, m)
    ci = a["wilson95"]
    out[label] = {
        "turns": int(m.sum()),
        "significant": a["items"],
        "agreement": None if a["agreement"] is None else round(float(a["agreement"]), 4),
        "agreement_wilson95": None if ci is None else [round(float(ci[0]), 4), round(float(ci[1]), 4)],
        "credited": round(float(np.mean(est_i[m] > 0)), 4) if m.any() else None,
        "mean_estimate": round(float(np.mean(est_i[m] / rms_e)), 4) if m.any() else None,
        "mean_a_star": round(float(np.mean(a_star_i[m] / rms_a)), 4) if m.any() else None,
    }
  return out


def plan_table_lines(result: dict) -> list[str]:
  """The printed table of the split (one row per estimator)."""
  rows = result["estimators"]
  first = next(iter(rows.values()))["walkthrough"]
  on, off = first["on_plan"], first["off_plan"]
  cell = lambda x: "-" if x["agreement"] is None else (  # noqa: E731
      f"{x['agreement']:.2f} [{x['agreement_wilson95'][0]:.2f}, {x['agreement_wilson95'][1]:.2f}]")
  fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
  lines = [f"| estimator | agreement on-plan (n={on['significant']}) | agreement off-plan (n={off['significant']}) "
           f"| credited on-plan ({on['turns']} turns) | credited off-plan ({off['turns']} turns) "
           f"| mean est. on / off | mean A* on / off |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  for name, r in rows.items():
    w = r["walkthrough"]
    label = name if not r.get("verdict") else f"{name} ({r['verdict']})"
    lines.append(f"| {label} | {cell(w['on_plan'])} | {cell(w['off_plan'])} | {fmt(w['on_plan']['credited'], '.2f')} "
                 f"| {fmt(w['off_plan']['credited'], '.2f')} | {fmt(w['on_plan']['mean_estimate'], '+.2f')} / "
                 f"{fmt(w['off_plan']['mean_estimate'], '+.2f')} | {fmt(w['on_plan']['mean_a_star'], '+.2f')} / "
                 f"{fmt(w['off_plan']['mean_a_star'], '+.2f')} |")
  return lines
