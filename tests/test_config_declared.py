"""Every config key the package reads is declared in the base config (mtrl_jax/config.py).

A key read with a default (`rl.get("shuffle_advantages", False)`,
`getattr(c, "x", 0)`, `"x" in c.rl`) runs silently with a typo in a config
file or on the command line, against the promise that a typo fails before
any compute. The scan reads the package's source (ast): every such read on a
config section (`c`, `self.c`, `config`, `c.rl`, a name bound to one, or
`read_field(mesh_cfg, ...)`) must name a key the base config declares there
(configs/lab.py's lab_block for the lab's section).

Breaks checked: rl.shuffle_advantages taken out of base_config -> "rl.shuffle_advantages
is read (mtrl_jax/train/learner.py:...) but not declared"; a new `self.c.rl.get("typo", 0)` in
train/learner.py -> named the same way.
"""
import ast
import os

import pytest

from configs.lab import lab_block
from mtrl_jax.config import base_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "mtrl_jax")
ROOTS = {"c", "config"}  # names (and self.<name>, run.<name>) that hold the whole config
SECTION_PARAMS = {"mesh_cfg": ("mesh",)}  # parameters that hold one section
OPEN = {("env", "kwargs"), ("rl", "estimator_kwargs")}  # checked against the env / estimator instead


def declared() -> dict:
  tree = base_config().to_dict()
  tree["lab"] = lab_block(1, 1).to_dict()
  return tree


def _path(node, aliases):
  """The config section an expression holds, as a tuple of keys; None when it is not a config."""
  if isinstance(node, ast.Name):
    if node.id in aliases:
      return aliases[node.id]
    return () if node.id in ROOTS else SECTION_PARAMS.get(node.id)
  if isinstance(node, ast.Attribute):
    if isinstance(node.value, ast.Name) and node.value.id in ("self", "run") and node.attr in ROOTS:
      return ()
    base = _path(node.value, aliases)
    return None if base is None else (*base, node.attr)
  return None


def _aliases(func) -> dict:
  """Names a function binds to a config section: `rl = c.rl`, `c, rl = self.c, self.c.rl`, `v = c.value_pretrain`."""
  out = {}
  for node in ast.walk(func):
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
      t, v = node.targets[0], node.value
      pairs = (zip(t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple)
               and len(t.elts) == len(v.elts) else [(t, v)])
      for name, value in pairs:
        if isinstance(name, ast.Name) and name.id not in ROOTS:
          p = _path(value, out)
          if p:
            out[name.id] = p
  return out


def reads(source: str):
  """(section path, key, line) of every defaulted read of a config key in `source`."""
  found = []
  tree = ast.parse(source)
  funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
  for func in funcs:
    aliases = _aliases(func)
    for node in ast.walk(func):
      target = key = None
      if isinstance(node, ast.Call) and node.args:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "get" and isinstance(node.args[0], ast.Constant):
          target, key = f.value, node.args[0].value
        elif isinstance(f, ast.Name) and f.id in ("getattr", "hasattr", "read_field") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant):
          target, key = node.args[0], node.args[1].value
      elif (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and isinstance(node.left, ast.Constant)):
        target, key = node.comparators[0], node.left.value
      if target is None or not isinstance(key, str):
        continue
      path = _path(target, aliases)
      if path is not None:
        found.append((path, key, node.lineno, isinstance(node, ast.Compare)))
  return found


def undeclared(source: str, where: str, tree=None) -> list[str]:
  tree = declared() if tree is None else tree
  bad = []
  for path, key, line, membership in reads(source):
    if any(path[:len(o)] == o for o in OPEN):
      continue
    node = tree
    for part in path:
      node = node.get(part) if isinstance(node, dict) else None
    if membership and isinstance(node, (list, tuple)):  # `"rl" in c.stages`: a value, not a key
      continue
    if not isinstance(node, dict):
      bad.append(f"{'.'.join(path)} is read ({where}:{line}) but is not a declared section")
    elif key not in node:
      bad.append(f"{'.'.join((*path, key))} is read ({where}:{line}) but not declared in the base config")
  return bad


def _package_files():
  for folder, _, files in os.walk(PACKAGE):
    for f in sorted(files):
      if f.endswith(".py"):
        yield os.path.join(folder, f)


def test_every_config_key_the_package_reads_is_declared():
  bad, seen = [], 0
  tree = declared()
  for path in _package_files():
    with open(path) as f:
      src = f.read()
    rel = os.path.relpath(path, ROOT)
    seen += len(reads(src))
    bad += undeclared(src, rel, tree)
  assert not bad, "\n".join(bad)
  assert seen >= 5  # the scan finds the reads it is meant to check (the mesh and distributed sections' among them)


@pytest.mark.parametrize("snippet", [
    "def f(self):\n  return self.c.rl.get('shuffle_advantagez', False)\n",
    "def f(c):\n  rl = c.rl\n  return rl.get('typo', 0)\n",
    "def f(self):\n  c, v = self.c, self.c.value_pretrain\n  return getattr(v, 'patiense', 3)\n",
    "def f(c):\n  return 'new_flag' in c.rollout\n",
    "def f(mesh_cfg):\n  return read_field(mesh_cfg, 'shapes')\n",
])
def test_the_scan_names_an_undeclared_key(snippet):
  """Each form of a defaulted read, with a key the base config lacks, is reported with its name."""
  bad = undeclared(snippet, "x.py")
  assert len(bad) == 1 and "not declared" in bad[0], bad


def test_declared_keys_pass_and_other_objects_are_not_configs():
  src = ("def f(self, info):\n  rl = self.c.rl\n  a = rl.get('aaw', False)\n  b = info.get('whatever')\n"
         "  return a, b, self.c.get('lr_guard'), dict(self.c.env.kwargs).get('crn')\n")
  assert undeclared(src, "x.py") == []
  assert [r[:2] for r in reads(src)] == [(("rl",), "aaw"), ((), "lr_guard")]


def test_shuffle_advantages_is_declared_and_validated():
  """rl.shuffle_advantages has a declared default (False) and validate() names a non-bool value."""
  from mtrl_jax.config import validate
  c = base_config()
  assert c.rl.shuffle_advantages is False
  c.rl.shuffle_advantages = True
  validate(c)
  c = base_config().to_dict()
  c["rl"]["shuffle_advantages"] = "yes"
  import ml_collections
  with pytest.raises(ValueError, match="config.rl.shuffle_advantages"):
    validate(ml_collections.ConfigDict(c))


@pytest.mark.parametrize("field,value,match", [
    ("shuffle_scope", "turn0", "config.rl.shuffle_scope"),
    ("shuffle_fraction", 0.0, "config.rl.shuffle_fraction"),
    ("shuffle_fraction", 1.5, "config.rl.shuffle_fraction"),
])
def test_graded_control_fields_are_declared_and_validated(field, value, match):
  """rl.shuffle_scope / rl.shuffle_fraction (the graded control) default to the old control ('all', 1.0);
  validate() names a bad scope, a fraction outside (0, 1], a fraction < 1 without the decision scope, and
  either set while rl.shuffle_advantages is off (a control that would silently not run).
  Breaks checked: each check taken out of config.validate fails its case."""
  from mtrl_jax.config import validate
  import ml_collections
  c = base_config()
  assert (c.rl.shuffle_scope, c.rl.shuffle_fraction) == ("all", 1.0)
  c.rl.update(shuffle_advantages=True, shuffle_scope="decision", shuffle_fraction=0.25)
  validate(c)
  bad = c.to_dict()
  bad["rl"][field] = value
  with pytest.raises(ValueError, match=match):
    validate(ml_collections.ConfigDict(bad))
  c = base_config()
  c.rl.update(shuffle_advantages=True, shuffle_fraction=0.5)  # scope 'all' shuffles every token: 1 only
  with pytest.raises(ValueError, match="config.rl.shuffle_fraction.*shuffle_scope"):
    validate(c)
  c = base_config()
  c.rl.shuffle_scope = "decision"  # without rl.shuffle_advantages nothing would run
  with pytest.raises(ValueError, match="config.rl.shuffle_scope.*shuffle_advantages is False"):
    validate(c)
