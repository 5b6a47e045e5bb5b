"""The credit-assignment study (docs/STUDY.md): its plan, runner, records, statistics and report.

  python -m experiments.study --root ROOT --parallel 2 --probes   # runs the plan; a record per finished job
  python -m experiments.study.report                              # docs/study/ -> docs/STUDY.md + figures
  python -m experiments.study.report --round 3                    # docs/study3/ -> docs/STUDY3.md
  python -m experiments.study.records --ceilings                  # every probe's ceiling record
  python -m experiments.study.readme                              # README's study table from the headline

The modules, each importing only those above it in this list (no cycle):

  plan.py      the experiments, their cells and comparisons, the probe tasks (data only)
  round3.py    the third round's plan (issue 41), pre-registered: delayed(cue), critic quality, graded controls
  stats.py     paired differences, t intervals, Holm, dz, MDE, the verdict words (numpy, scipy)
  records.py   one small JSON record per finished job (with the code it was made by), and where they live
  versions.py  which code made each record; the refusal to compare records of differing code
  starts.py    whether a root's warm starts and critics are the ones their records name (checked before runs)
  runner.py    the resumable runner on experiments/sweep.py's job runner (`python -m experiments.study`)
  verdicts.py  each cell's numbers, every claim's paired tests, Holm, the verdicts
  tables.py    the report's tables and figures
  prose.py     the report's fixed text: what the statistics and the setup are
  machines.py  how far another machine moves round 3's numbers (the round's records vs a replica's)
  graded.py    round 3's graded controls per probe (the smallest effect detected) and the claims' bound by them
  interaction.py  round 3's pre-registered interaction tests (per-seed double differences), each its own Holm family
  report3.py   docs/STUDY3.md, round 3's report, from its records alone (report.py --round 3)
  report.py    docs/STUDY.md from the records alone (--round 3: report3.py's)
  readme.py    the README's study table from STUDY.md's headline
  pilot3.py    the third round's pilot runs and their table (docs/STUDY_ROUND3.md)

The critic bar (is a pretrained critic good enough to test a claim that rests on it?) is the
package's rule, mtrl_jax/train/critic_bar.py, not the study's own.
"""
