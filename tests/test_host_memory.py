"""Huge pages for glibc's large blocks: when the entry point runs itself again, and that it does."""

import os
import platform
import subprocess
import sys

import pytest

from tests.test_train import REPO
from transformer import host_memory

GLIBC = ("glibc", "2.36")
# The environment of the child processes: without any GLIBC_TUNABLES of the test's own.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}


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


def test_use_huge_pages_runs_the_command_again_with_the_tunable():
  """In a child: the tunable it ends with is the one `huge_pages_environment` asks for here, and
  the command (its arguments) is the same after the execve."""
  code = ("import os, sys; from transformer import host_memory; host_memory.use_huge_pages(); "
          "print(os.environ.get('GLIBC_TUNABLES'), sys.argv[1:])")
  proc = subprocess.run([sys.executable, "-c", code, "x", "--y=1"], capture_output=True,
                        text=True, timeout=120, env=CHILD_ENV, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == f"{expected_tunables()} ['x', '--y=1']"


def test_the_training_command_runs_with_huge_pages_where_they_help(tmp_path):
  """`python -m transformer.main` logs its host-memory state; here a run that stops at its data
  check (no WMT data) is enough to see it."""
  proc = subprocess.run(
    [sys.executable, "-m", "transformer.main", "--config=configs/wmt.py:tiny",
     f"--workdir={tmp_path}/w", f"--config.data_dir={tmp_path}/no_data"],
    cwd=REPO, env=CHILD_ENV, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  line = next((ln for ln in proc.stderr.splitlines() if "Host memory: " in ln), None)
  assert line is not None, proc.stderr[-2000:]
  assert ("glibc.malloc.hugetlb=1" in line) == (expected_tunables() is not None), line
