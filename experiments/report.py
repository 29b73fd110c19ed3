"""Report helpers shared by the experiments: the machine, the command, tables, figures.

A library without flags: every experiment that writes a report imports it.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from typing import Any


def cpu_model() -> str:
  """The CPU's model name from /proc/cpuinfo (or what the platform module knows)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
  """What ran the experiment: CPU, cores, load, JAX backend and devices, date."""
  import jax

  try:
    load = os.getloadavg()[0]
  except OSError:
    load = None
  devices = jax.devices()
  return {
    "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    "cpu": cpu_model(),
    "cpu_count": os.cpu_count(),
    "load_avg_1m": load,
    "backend": jax.default_backend(),
    "device_kind": devices[0].device_kind,
    "device_count": len(devices),
    "jax": jax.__version__,
    "python": platform.python_version(),
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }


def hardware_markdown(hw: dict[str, Any]) -> str:
  """The `## Machine` section's bullet list of a `hardware()` dict."""
  load = "n/a" if hw["load_avg_1m"] is None else f"{hw['load_avg_1m']:.2f}"
  return (
    f"- Date: {hw['date']}.\n"
    f"- CPU: `{hw['cpu']}`, {hw['cpu_count']} cores; load average (1 min) {load} when the "
    "report was written (the machine is shared: step times are noisy).\n"
    f"- JAX {hw['jax']}, backend `{hw['backend']}` ({hw['device_kind']}), "
    f"{hw['device_count']} device(s) in the reporting process; `XLA_FLAGS`="
    f"`{hw['xla_flags']}`; Python {hw['python']}.\n"
  )


def command_line(argv: Sequence[str] | None = None) -> str:
  """The running command, `[XLA_FLAGS=...] [nice -n N] python -m module args...`."""
  argv = list(sys.argv if argv is None else argv)
  prog = argv[0]
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  if spec is not None and spec.name and prog.endswith(".py"):
    head = ["python", "-m", spec.name]
  else:
    head = ["python", prog]
  env = [f"XLA_FLAGS={shlex.quote(os.environ['XLA_FLAGS'])}"] if "XLA_FLAGS" in os.environ else []
  niceness = os.nice(0)
  prefix = env + (["nice", "-n", str(niceness)] if niceness > 0 else [])
  return " ".join(prefix + [shlex.quote(a) for a in head + argv[1:]])


def fmt(value: Any, digits: int = 2) -> str:
  """A table cell: '-' for None, floats with `digits` decimals, anything else as str."""
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}f}"
  return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]],
                   align: str | None = None) -> str:
  """A GitHub table; `align` is one character per column, l or r (default: l, then r)."""
  align = align or "l" + "r" * (len(header) - 1)
  sep = ["---:" if a == "r" else "---" for a in align]
  lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def figure(rows: int, cols: int, figsize: tuple[float, float], **kwargs: Any) -> tuple[Any, Any]:
  """`plt.subplots(rows, cols, ...)` on the file-only Agg backend: (figure, axes)."""
  import matplotlib

  matplotlib.use("Agg")  # no display: figures only go to files
  import matplotlib.pyplot as plt

  return plt.subplots(rows, cols, figsize=figsize, **kwargs)


def save_figure(fig: Any, path: str, dpi: int = 120) -> None:
  """Lays the figure out, writes it to `path` (making its directory) and frees it."""
  import matplotlib.pyplot as plt

  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=dpi)
  plt.close(fig)
