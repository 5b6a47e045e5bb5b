"""`python -m mtrl_jax.envs.textworld --kind coin_collector --level 10 --games 200`: build or check a pool."""
import sys

from mtrl_jax.envs.textworld.pool import main

main(sys.argv[1:])
