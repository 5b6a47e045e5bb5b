"""`python -m experiments.study ...`: the study's runner (runner.py)."""
import sys

from experiments.study.runner import main

sys.exit(main())
