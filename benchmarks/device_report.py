"""The JSON records of benchmarks/device_check.sh: one per stage, and the summary.

    python benchmarks/device_report.py stage NAME --log LOG --rc RC --seconds S --timeout T \
        [--workdir W] [--skip REASON] --out OUT/NAME.json
    python benchmarks/device_report.py summary --dir OUT --env ENV.json --budget B --seconds S

A stage's record keeps what its log or workdir says even when the stage was
killed at its timeout: the learner's and the rollout benchmark's table rows
are read from the lines they print as they go, and a main job's learning
curve from its metrics.jsonl, so a stage cut short still reports what it
measured. Each command prints its record as one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("weights", "main_job", "smol", "bf16_mismatch", "rollout", "learner",
          "smol_study",  # SMOL_STUDY=1: weights and smol_study run, the rest is skipped
          "textworld")  # TEXTWORLD=1: weights and textworld run (benchmarks/textworld_smol.sh), the rest skipped
TIMEOUT_RCS = (124, 137)  # timeout(1)'s own code, and SIGKILL after --kill-after


def last_json(text: str) -> dict | None:
  """The last line of `text` that parses as a JSON object."""
  for line in reversed(text.strip().splitlines()):
    line = line.strip()
    if line.startswith("{"):
      try:
        return json.loads(line)
      except json.JSONDecodeError:
        continue
  return None


def read_metrics(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  out = []
  if os.path.exists(path):
    for line in open(path):
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue  # a line cut by the timeout
  return out


def run_record(workdir: str) -> dict:
  """A main job's learning curve, per-update seconds and final evaluation, from its metrics.jsonl."""
  recs = read_metrics(workdir)
  rl = [r for r in recs if r.get("stage") == "rl"]
  updates = [r for r in rl if "time/step_s" in r]
  curve = [{"step": r["step"], **{k: r[k] for k in ("rollout/success", "rollout/return", "eval/success",
                                                     "eval/greedy_success") if r.get(k) is not None}}
           for r in rl]
  secs = [float(r["time/step_s"]) for r in updates]
  out = {"rl_updates": len(updates), "curve": curve, "update_s": [round(s, 3) for s in secs]}
  if secs:
    out["first_update_s"] = round(secs[0], 3)
    if len(secs) > 1:
      out["median_update_s_after_first"] = round(statistics.median(secs[1:]), 3)
  sft = [r for r in recs if r.get("stage") == "sft"]
  if sft:
    out["sft_steps"] = max(r["step"] for r in sft)
  final = [r for r in recs if r.get("stage") == "eval"]
  if final:
    out["final"] = {k: v for k, v in final[-1].items() if k.startswith("eval/")}
  return out


_T8K = re.compile(r"on (?P<device>.+?): T=8192 (?P<tok>[\d.]+) tok/s, (?P<tf>[\d.]+) TFLOP/s, MFU (?P<mfu>\S+)")
_TRY = re.compile(r"T=(?P<t>\d+): (?P<ok>runs|fails)(?:, (?P<s>[\d.]+) s per update, (?P<tok>[\d.]+) tok/s)?")


def learner_record(log: str) -> dict:
  """benchmarks/learner.py --run: its JSON line, or what it printed before it was stopped."""
  j = last_json(log)
  if j is not None and "rl_mfu_t8k" in j:
    return {k: j[k] for k in ("device", "rl_tok_s_t8k", "rl_step_s_t8k", "rl_tflops_t8k", "rl_mfu_t8k",
                              "max_t_fit", "max_t_tried") if k in j}
  out: dict = {"partial": True}
  m = _T8K.search(log)
  if m:
    mfu = m["mfu"]
    out.update(device=m["device"].strip(), rl_tok_s_t8k=float(m["tok"]), rl_tflops_t8k=float(m["tf"]),
               rl_mfu_t8k=None if mfu == "None" else float(mfu))
  tried = [{"seq_len": int(t["t"]), "ok": t["ok"] == "runs",
            **({"step_s": float(t["s"]), "tok_s": float(t["tok"])} if t["s"] else {})}
           for t in _TRY.finditer(log)]
  out["max_t_tried"] = tried
  ran = [t["seq_len"] for t in tried if t["ok"]]
  out["max_t_fit"] = max(ran) if ran else (8192 if m else 0)
  return out


_ARM = re.compile(r"^  (?P<arm>lockstep|continuous[^:]*): (?P<wall>[\d.]+) s \(reps", re.M)


def rollout_record(log: str) -> dict:
  j = last_json(log)
  if j is not None and "sessions_per_s_ratio" in j:
    return {k: v for k, v in j.items() if k not in ("args",)}
  return {"partial": True, "arm_wall_s": {m["arm"]: float(m["wall"]) for m in _ARM.finditer(log)}}


def stage_record(name: str, log_text: str, rc: int, seconds: float, timeout: float, workdir: str | None,
                 skip: str | None) -> dict:
  rec: dict = {"stage": name, "rc": rc, "seconds": round(seconds, 1), "timeout_s": timeout}
  if skip:
    rec.update(status="skipped", reason=skip)
    return rec
  rec["status"] = "ok" if rc == 0 else "timeout" if rc in TIMEOUT_RCS else "failed"
  if name in ("main_job", "smol"):
    rec["result"] = run_record(workdir) if workdir else {}
  elif name == "learner":
    rec["result"] = learner_record(log_text)
  elif name == "rollout":
    rec["result"] = rollout_record(log_text)
  else:
    rec["result"] = last_json(log_text) or {}
  if rec["status"] != "ok":
    rec["log_tail"] = log_text[-2000:]
  return rec


def headline(stages: dict) -> dict:
  """The numbers RESULTS.md and the issue ask for, flat."""
  h: dict = {}
  get = lambda s: stages.get(s, {}).get("result") or {}  # noqa: E731
  w = get("weights")
  h["weights"] = w.get("weights")
  for name in ("main_job", "smol"):
    r = get(name)
    h[f"{name}_s"] = stages.get(name, {}).get("seconds")
    h[f"{name}_final"] = r.get("final")
    h[f"{name}_median_update_s"] = r.get("median_update_s_after_first")
    h[f"{name}_first_update_s"] = r.get("first_update_s")
  lr = get("learner")
  h.update(learner_mfu_t8k=lr.get("rl_mfu_t8k"), learner_tok_s_t8k=lr.get("rl_tok_s_t8k"),
           learner_max_t=lr.get("max_t_fit"))
  ro = get("rollout")
  h.update(rollout_sessions_per_s_ratio=ro.get("sessions_per_s_ratio"),
           rollout_slot_util_continuous=ro.get("slot_util_continuous"))
  # the study on SmolLM2 (SMOL_STUDY=1): the study's runner's summary line (runs, ran, failed)
  h.update(smol_study_s=stages.get("smol_study", {}).get("seconds"), smol_study=get("smol_study") or None)
  # SmolLM2 on TextWorld (TEXTWORLD=1): textworld_smol.sh's line (zero_shot, after_sft, after_rl)
  tw = get("textworld")
  h.update(textworld_s=stages.get("textworld", {}).get("seconds"),
           **{f"textworld_{k}": tw.get(k) for k in ("zero_shot", "after_sft", "after_rl")})
  mm = (get("bf16_mismatch").get("results") or {})
  h.update(bf16_mismatch_share=(mm.get("bfloat16") or {}).get("share_outside"),
           fp32_mismatch_share=(mm.get("float32") or {}).get("share_outside"))
  return h


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="cmd", required=True)
  s = sub.add_parser("stage")
  s.add_argument("name", choices=STAGES)
  s.add_argument("--log", default="")
  s.add_argument("--rc", type=int, default=0)
  s.add_argument("--seconds", type=float, default=0.0)
  s.add_argument("--timeout", type=float, default=0.0)
  s.add_argument("--workdir", default=None)
  s.add_argument("--skip", default=None, help="the reason the stage did not run")
  s.add_argument("--out", required=True)
  m = sub.add_parser("summary")
  m.add_argument("--dir", required=True)
  m.add_argument("--env", default="")
  m.add_argument("--budget", type=float, required=True)
  m.add_argument("--seconds", type=float, required=True)
  m.add_argument("--dry-run", action="store_true")
  a = ap.parse_args(argv)
  if a.cmd == "stage":
    text = open(a.log, errors="replace").read() if a.log and os.path.exists(a.log) else ""
    rec = stage_record(a.name, text, a.rc, a.seconds, a.timeout, a.workdir, a.skip)
    with open(a.out, "w") as f:
      json.dump(rec, f, indent=1)
    print(json.dumps({k: rec[k] for k in ("stage", "status", "seconds")}))
    return 0
  stages = {}
  for name in STAGES:
    path = os.path.join(a.dir, f"{name}.json")
    stages[name] = json.load(open(path)) if os.path.exists(path) else {"status": "not run"}
  env = json.load(open(a.env)) if a.env and os.path.exists(a.env) else {}
  summary = {"dry_run": a.dry_run, "budget_s": a.budget, "total_s": round(a.seconds, 1), "env": env,
             "status": {n: s.get("status") for n, s in stages.items()}, "headline": headline(stages),
             "stages": stages}
  with open(os.path.join(a.dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  print(json.dumps({"total_s": summary["total_s"], "status": summary["status"], "headline": summary["headline"]}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
