"""Scripted-expert demonstrations as a TFDS dataset (array_record, no TensorFlow).

  path = build_demos("memory", {"length": 8}, episodes=1000, data_dir="/data/demos",
                     quality=0.9)
  sessions = load_demos("/data/demos", "memory", {"length": 8}, quality=0.9)
  sessions[0]["turns"][0]   # {"observation": "peek or skip?", "action": "peek", ...}

  python -m mtrl_jax.data.demos --env memory --episodes 1000 --data_dir /data/demos \
      --quality 0.9 --env_kwargs '{"length": 8}'

One builder (`mtrl_demos`) with one config per (env, env_kwargs, quality,
seed, episodes), named e.g. `memory-q090-s0-n1000-3f2a9c1e`, so several envs
and qualities share a data_dir without clashing. Building an existing config
again is a no-op. `quality` is the probability of taking the expert's action
(else a uniformly random one): 1.0 is the pure expert.

Episode i uses env seed `seed + i`. An episode whose env raises `EnvError` is
left out (so a dataset may hold fewer than `episodes` sessions).
"""
from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import json
import os
import random
from typing import Any, Sequence

from absl import app, flags, logging
import numpy as np
import tensorflow_datasets as tfds

from mtrl_jax.envs import EnvError, derive_seed, make, policy_action

DATASET = "mtrl_demos"
VERSION = "1.0.0"


@dataclasses.dataclass
class DemosConfig(tfds.core.BuilderConfig):
  env_name: str = "memory"
  env_kwargs_json: str = "{}"
  quality: float = 1.0
  episodes: int = 100
  seed: int = 0


def _plain(x):
  """Config containers (e.g. a nested ConfigDict in env kwargs) as JSON-able values."""
  if hasattr(x, "to_dict"):  # ml_collections.ConfigDict is no Mapping
    x = x.to_dict()
  if isinstance(x, collections.abc.Mapping):
    return {str(k): _plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_plain(v) for v in x]
  return x


def config_name(env_name: str, env_kwargs: dict | None, quality: float, seed: int,
                episodes: int) -> str:
  """Config name: readable knobs plus a hash of everything that shapes the data."""
  kwargs_json = json.dumps(_plain(env_kwargs or {}), sort_keys=True)
  digest = hashlib.sha1(f"{env_name}|{kwargs_json}|{quality!r}".encode()).hexdigest()[:8]
  return f"{env_name}-q{round(quality * 100):03d}-s{seed}-n{episodes}-{digest}"


class MtrlDemos(tfds.core.GeneratorBasedBuilder):
  """Sessions of a scripted policy in a registered env."""

  VERSION = tfds.core.Version(VERSION)
  RELEASE_NOTES = {str(VERSION): "Scripted-expert sessions, turns as a Sequence feature."}
  BUILDER_CONFIGS = []  # made on the fly (see `builder`)

  def _info(self) -> tfds.core.DatasetInfo:
    # Returned directly: `dataset_info_from_configs` needs package metadata files.
    turn = {"observation": tfds.features.Text(), "action": tfds.features.Text(),
            "reward": np.float32, "invalid": np.bool_}
    return tfds.core.DatasetInfo(
        builder=self,
        description="Scripted-policy sessions: per turn the observation seen, the action "
        "taken, the reward it earned; plus the episode's return and success.",
        features=tfds.features.FeaturesDict({
            "env": tfds.features.Text(),
            "env_kwargs": tfds.features.Text(),  # JSON
            "seed": np.int64,
            "quality": np.float32,
            "prompt": tfds.features.Text(),
            "turns": tfds.features.Sequence(turn),
            "final_observation": tfds.features.Text(),
            "return": np.float32,
            "success": np.bool_,
            "truncated": np.bool_,
            "num_turns": np.int32,
        }),
        disable_shuffling=True,  # keep episode order: session i has seed `seed + i`
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    cfg = self.builder_config
    kwargs = json.loads(cfg.env_kwargs_json)
    env = make(cfg.env_name, **kwargs)
    for i in range(cfg.episodes):
      try:
        yield i, record_episode(env, cfg.seed + i, cfg.quality, cfg.env_name, kwargs)
      except EnvError:
        continue


def record_episode(env, seed: int, quality: float, env_name: str, env_kwargs: dict) -> dict:
  """One session of the expert (at `quality`) as a dataset example."""
  rng = random.Random(derive_seed("demos", seed))
  first = env.reset(seed, 0)  # session 0 of its task: envs with per-session noise stay reproducible
  obs, turns, ret = first.observation, [], 0.0
  while True:
    action = policy_action(env, "expert", rng, quality)
    out = env.step(action)
    turns.append({"observation": obs, "action": action, "reward": out.reward,
                  "invalid": bool(out.info.get("invalid_action"))})
    ret += out.reward
    obs = out.observation
    if out.terminated or out.truncated:
      break
  return {"env": env_name, "env_kwargs": json.dumps(env_kwargs, sort_keys=True), "seed": seed,
          "quality": quality, "prompt": first.prompt, "turns": turns,
          "final_observation": obs, "return": ret, "success": bool(out.info.get("success")),
          "truncated": out.truncated, "num_turns": len(turns)}


def builder(env_name: str, env_kwargs: dict | None = None, episodes: int = 100,
            data_dir: str = "", quality: float = 1.0, seed: int = 0) -> MtrlDemos:
  if not 0.0 <= quality <= 1.0:
    raise ValueError(f"quality must be in [0, 1], got {quality}")
  env_kwargs = _plain(env_kwargs or {})
  make(env_name, **(env_kwargs or {}))  # fail early on a bad env name or argument
  cfg = DemosConfig(name=config_name(env_name, env_kwargs, quality, seed, episodes),
                    version=VERSION, env_name=env_name,
                    env_kwargs_json=json.dumps(env_kwargs or {}, sort_keys=True),
                    quality=quality, episodes=episodes, seed=seed,
                    description=f"{episodes} episodes of {env_name} {env_kwargs or {}}, "
                    f"quality {quality}, seeds {seed}..{seed + episodes - 1}")
  return MtrlDemos(config=cfg, data_dir=os.fspath(data_dir), file_format="array_record")


def build_demos(env_name: str, env_kwargs: dict | None = None, episodes: int = 100,
                data_dir: str = "", quality: float = 1.0, seed: int = 0) -> str:
  """Records the sessions (unless already there); returns the dataset directory."""
  b = builder(env_name, env_kwargs, episodes, data_dir, quality, seed)
  b.download_and_prepare()
  return os.fspath(b.data_dir)


class DemoSessions(collections.abc.Sequence):
  """A lazy, random-access sequence of session dicts over an array_record source."""

  def __init__(self, source):
    self._source = source

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self[j] for j in range(*i.indices(len(self)))]
    n = len(self)
    if not -n <= i < n:
      raise IndexError(f"session {i} out of range ({n} sessions)")
    return _to_session(self._source[i % n])

  def __iter__(self):
    return (self[i] for i in range(len(self)))


def _text(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def _to_session(ex: dict) -> dict[str, Any]:
  t = ex["turns"]
  turns = [{"observation": _text(o), "action": _text(a), "reward": float(r), "invalid": bool(v)}
           for o, a, r, v in zip(t["observation"], t["action"], t["reward"], t["invalid"])]
  return {"env": _text(ex["env"]), "env_kwargs": json.loads(_text(ex["env_kwargs"])),
          "seed": int(ex["seed"]), "quality": float(ex["quality"]),
          "prompt": _text(ex["prompt"]), "turns": turns,
          "final_observation": _text(ex["final_observation"]),
          "return": float(ex["return"]), "success": bool(ex["success"]),
          "truncated": bool(ex["truncated"]), "num_turns": int(ex["num_turns"])}


def list_demos(data_dir: str) -> list[str]:
  """Dataset directories (one per config and version) under data_dir."""
  root = os.path.join(os.fspath(data_dir), DATASET)
  if not os.path.isdir(root):
    return []
  return sorted(os.path.join(root, c, v) for c in os.listdir(root)
                for v in os.listdir(os.path.join(root, c))
                if os.path.isfile(os.path.join(root, c, v, "dataset_info.json")))


def find_demos(data_dir: str, env_name: str | None = None, env_kwargs: dict | None = None,
               quality: float = 1.0, seed: int = 0, episodes: int | None = None) -> str:
  """The dataset directory for these knobs (largest `episodes` when not given)."""
  data_dir = os.fspath(data_dir)
  if os.path.isfile(os.path.join(data_dir, "dataset_info.json")):
    return data_dir
  found = list_demos(data_dir)
  if env_name is None:
    if len(found) == 1:
      return found[0]
    raise ValueError(f"{len(found)} demo datasets in {data_dir}; name the env (and knobs): "
                     f"{[os.path.basename(os.path.dirname(p)) for p in found]}")
  want = config_name(env_name, env_kwargs, quality, seed, episodes or 0)
  prefix, digest = want.rsplit("-n", 1)[0] + "-n", want.rsplit("-", 1)[1]
  matches = [p for p in found if os.path.basename(os.path.dirname(p)).startswith(prefix)
             and os.path.basename(os.path.dirname(p)).endswith(digest)]
  if episodes is not None:
    matches = [p for p in matches if os.path.basename(os.path.dirname(p)) == want]
  if not matches:
    raise FileNotFoundError(f"no demos for {want} in {data_dir}; build them with build_demos "
                            f"or `python -m mtrl_jax.data.demos`")
  return max(matches, key=lambda p: int(os.path.basename(os.path.dirname(p))
                                        .rsplit("-n", 1)[1].split("-")[0]))


def load_demos(data_dir: str, env_name: str | None = None, env_kwargs: dict | None = None,
               quality: float = 1.0, seed: int = 0, episodes: int | None = None,
               split: str = "train") -> DemoSessions:
  """Sessions as dicts: env, env_kwargs, seed, quality, prompt, turns (observation,
  action, reward, invalid), final_observation, return, success, truncated, num_turns.

  `data_dir` is the root given to build_demos (then pick the dataset by its
  knobs) or a dataset directory itself.
  """
  path = find_demos(data_dir, env_name, env_kwargs, quality, seed, episodes)
  return DemoSessions(tfds.builder_from_directory(path).as_data_source(split=split))


def summarize(sessions: Sequence[dict]) -> dict:
  n = max(len(sessions), 1)
  return {"sessions": len(sessions),
          "success_rate": sum(s["success"] for s in sessions) / n,
          "mean_return": sum(s["return"] for s in sessions) / n,
          "mean_turns": sum(s["num_turns"] for s in sessions) / n}


def define_flags() -> None:
  """CLI flags; defined on demand so importing this module defines none."""
  flags.DEFINE_string("env", None, "Registered env name.", required=True)
  flags.DEFINE_string("env_kwargs", "{}", "JSON dict of env keyword arguments.")
  flags.DEFINE_integer("episodes", 100, "Episodes to record.")
  flags.DEFINE_string("data_dir", None, "TFDS data_dir (root of all demo sets).", required=True)
  flags.DEFINE_float("quality", 1.0, "Probability of the expert action per turn.")
  flags.DEFINE_integer("seed", 0, "Episode i uses env seed seed + i.")

def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # TFDS narrates every file it writes
  tfds.disable_progress_bar()
  f = flags.FLAGS
  kwargs = json.loads(f.env_kwargs)
  path = build_demos(f.env, kwargs, f.episodes, f.data_dir, f.quality, f.seed)
  sessions = load_demos(path)
  s = summarize(sessions)
  print(f"demos: {path}")
  print(f"  {s['sessions']} sessions of {f.env} {json.dumps(kwargs)}, quality "
        f"{f.quality}: success {s['success_rate']:.3f}  return {s['mean_return']:+.3f}  "
        f"turns {s['mean_turns']:.2f}")
  if len(sessions):
    first = sessions[0]
    print(f"  session 0 (seed {first['seed']}): prompt {first['prompt']!r}")
    for t in first["turns"]:
      print(f"    {t['observation']!r} -> {t['action']!r} ({t['reward']:+g})")
  print(json.dumps({"path": path, **s}))


if __name__ == "__main__":
  define_flags()
  app.run(main)
