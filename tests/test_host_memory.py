"""Huge pages for glibc's large blocks, opt-in: when the entry point runs itself again (only when
asked to, and only where they help), and that it does."""

import os
import platform
import subprocess
import sys

import pytest

from tests.test_train import REPO
from transformer import host_memory

GLIBC = ("glibc", "2.36")
# The environment of the child processes: without any GLIBC_TUNABLES or opt-in of the test's own.
CHILD_ENV = {k: v for k, v in os.environ.items()
             if k not in ("GLIBC_TUNABLES", host_memory.OPT_IN)}
OPTED_IN = {**CHILD_ENV, host_memory.OPT_IN: "1"}


def expected_tunables() -> str | None:
  """GLIBC_TUNABLES that a child started with CHILD_ENV ends with on this machine."""
  env = host_memory.huge_pages_environment(CHILD_ENV, platform.libc_ver(), host_memory.thp_mode())
  return None if env is None else env["GLIBC_TUNABLES"]


def test_madvise_mode_on_a_recent_glibc_adds_the_tunable_to_the_others():
  env = host_memory.huge_pages_environment({"A": "1", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
                                           GLIBC, "madvise")
  assert env == {"A": "1", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
  assert host_memory.huge_pages_environment({}, GLIBC, "madvise") == {
    "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


@pytest.mark.parametrize("environ, libc, mode", [
  ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, GLIBC, "madvise"),  # the user's opt-out
  ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, GLIBC, "madvise"),  # after the execve
  ({}, GLIBC, "always"),  # large blocks have huge pages already
  ({}, GLIBC, "never"),
  ({}, GLIBC, None),  # no transparent huge pages in this kernel
  ({}, ("glibc", "2.34"), "madvise"),  # before the tunable
  ({}, ("", ""), "madvise"),  # musl, or a libc platform cannot name
])
def test_runs_on_as_it_is_where_huge_pages_cannot_help(environ, libc, mode):
  assert host_memory.huge_pages_environment(environ, libc, mode) is None


@pytest.mark.parametrize("text, mode", [
  ("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"),
  ("always madvise [never]\n", "never"), ("garbage\n", None)])
def test_thp_mode_is_the_bracketed_word(tmp_path, text, mode):
  path = tmp_path / "enabled"
  path.write_text(text)
  assert host_memory.thp_mode(str(path)) == mode
  assert host_memory.thp_mode(str(tmp_path / "absent")) is None


@pytest.mark.parametrize("opt_in", [False, True])
def test_use_huge_pages_runs_the_command_again_only_when_asked(opt_in):
  """In a child: without the opt-in the command runs on as it was started; with it, the tunable
  it ends with is the one `huge_pages_environment` asks for here, and the command (its
  arguments) is the same after the execve."""
  code = ("import os, sys; from transformer import host_memory; host_memory.use_huge_pages(); "
          "print(os.environ.get('GLIBC_TUNABLES'), sys.argv[1:])")
  proc = subprocess.run([sys.executable, "-c", code, "x", "--y=1"], capture_output=True,
                        text=True, timeout=120, env=OPTED_IN if opt_in else CHILD_ENV, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-2000:]
  tunables = expected_tunables() if opt_in else None
  assert proc.stdout.strip() == f"{tunables} ['x', '--y=1']"


@pytest.mark.parametrize("opt_in", [False, True])
def test_the_training_command_runs_with_huge_pages_only_when_asked(tmp_path, opt_in):
  """`python -m transformer.main` logs its host-memory state before anything else; here a run
  that stops at the config's check is enough to see it."""
  proc = subprocess.run(
    [sys.executable, "-m", "transformer.main", "--config=configs/numbers.py:tiny",
     f"--workdir={tmp_path}/w", "--config.num_train_steps=-1"],
    cwd=REPO, env=OPTED_IN if opt_in else CHILD_ENV, capture_output=True, text=True,
    timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  line = next((ln for ln in proc.stderr.splitlines() if "Host memory: " in ln), None)
  assert line is not None, proc.stderr[-2000:]
  helps = expected_tunables() is not None
  assert ("glibc.malloc.hugetlb=1" in line) == (opt_in and helps), line
  assert (f"{host_memory.OPT_IN}=1 would" in line) == (not opt_in and helps), line
