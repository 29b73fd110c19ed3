"""Host memory: glibc's large blocks on transparent huge pages, for XLA:CPU's per-step buffers.

XLA:CPU allocates the temporary buffers of every execution afresh (a training step's hold
hundreds of MiB), and glibc serves blocks that large with `mmap` and gives them back with
`munmap`, so the kernel maps and zeroes each 4 KiB page of them again in every step: about
200,000 minor page faults per step at the small shapes of experiments/compare_peer.py and
400,000 at the base model's (the page-fault column of benchmarks/results/train_step_vs_torch.md).
glibc 2.35 and later can ask for transparent huge pages for those blocks
(`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, https://www.gnu.org/software/libc/manual/html_node/
Memory-Allocation-Tunables.html): one fault per 2 MiB instead of per 4 KiB.

Opt-in: set that tunable yourself, or `TRANSFORMER_HUGE_PAGES=1` for `python -m
transformer.main`. The tunable is read when a process starts, so with the opt-in
`use_huge_pages` runs the same command again in the same process (`execve`), once, before
anything heavy is imported, where huge pages can help: Linux with glibc >= 2.35, transparent
huge pages in `madvise` mode (in `always` large blocks get them already, in `never` there are
none), and `glibc.malloc.hugetlb` not already in GLIBC_TUNABLES. Without the opt-in the command
runs once, as it was started.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb"
OPT_IN = "TRANSFORMER_HUGE_PAGES"  # =1: `use_huge_pages` may run the command again
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = THP_ENABLED) -> str | None:
  """The kernel's transparent-huge-page mode ('always', 'madvise', 'never'): the bracketed word
  of `path` ("always [madvise] never"); None where the file is absent or has none."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return None
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else None


def _hugetlb_setting(tunables: str) -> str | None:
  """The `glibc.malloc.hugetlb=...` entry of a GLIBC_TUNABLES value ('a=1:b=2'), or None."""
  return next((t for t in tunables.split(":") if t.startswith(TUNABLE + "=")), None)


def huge_pages_environment(environ: Mapping[str, str], libc: tuple[str, str],
                           mode: str | None) -> dict[str, str] | None:
  """The environment to run this process again in, with huge pages for glibc's large blocks;
  None to run on as it is.

  environ: the current environment; libc: `platform.libc_ver()`, e.g. ('glibc', '2.36');
  mode: `thp_mode()`.
  """
  if mode != "madvise":
    return None
  name, version = libc
  try:
    major_minor = tuple(int(x) for x in version.split(".")[:2])
  except ValueError:
    return None
  if name != "glibc" or major_minor < (2, 35):
    return None
  tunables = environ.get("GLIBC_TUNABLES", "")
  if _hugetlb_setting(tunables):  # set by the user (=0 opts out), or before the execve
    return None
  return {**environ, "GLIBC_TUNABLES": ":".join(t for t in (tunables, f"{TUNABLE}=1") if t)}


def state() -> str:
  """One line for the log: whether glibc's large blocks are on huge pages, and why."""
  setting = _hugetlb_setting(os.environ.get("GLIBC_TUNABLES", ""))
  if setting:
    return f"GLIBC_TUNABLES {setting} (transparent huge pages: {thp_mode()})"
  line = (f"glibc's default pages (transparent huge pages: {thp_mode()}; "
          f"libc: {' '.join(platform.libc_ver()) or 'unknown'})")
  if huge_pages_environment(os.environ, platform.libc_ver(), thp_mode()) is not None:
    line += f"; {OPT_IN}=1 would put its large blocks on huge pages"
  return line


def use_huge_pages() -> None:
  """With `TRANSFORMER_HUGE_PAGES=1` in the environment, runs this command again, in this
  process and with the same arguments, with `glibc.malloc.hugetlb=1` where
  `huge_pages_environment` says so; else returns."""
  argv = getattr(sys, "orig_argv", None)
  if os.environ.get(OPT_IN) != "1" or sys.platform != "linux" or not argv:
    return
  env = huge_pages_environment(os.environ, platform.libc_ver(), thp_mode())
  if env is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)
