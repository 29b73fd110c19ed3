"""Reports of the experiments and the benchmarks: the one writer of a result (`write`), the
machine, the command, tables, figures.

Every result is `NAME.md` beside `NAME.json`, each with the command that made it, the date,
the CPU and its kind and the rest of the machine. A question with variants (the same
benchmark with huge pages or AVX2 kernels, on another corpus) is one report with a section per
variant: re-running one variant replaces its section and keeps the others.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
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


# /proc/cpuinfo flags that decide how fast XLA:CPU and the peers run, in the order reported.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni",
                "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")


def cpu_kind(flags: set[str], machine: str, xla_flags: str = "") -> str:
  """A short label of the vector units code can use: 'x86-64 AVX-512', 'x86-64 AVX2', ...

  With `--xla_cpu_max_isa=ISA` in `xla_flags`, XLA:CPU generates code for at most that ISA:
  the label then says so, e.g. 'x86-64 AVX-512 (AVX2 only for XLA: --xla_cpu_max_isa=AVX2)'.
  """
  if {"amx_tile", "amx_bf16"} <= flags:
    kind = "x86-64 AVX-512 + AMX"
  elif "avx512f" in flags:
    kind = "x86-64 AVX-512"
  elif "avx2" in flags:
    kind = "x86-64 AVX2"
  elif "avx" in flags:
    kind = "x86-64 AVX"
  elif "sve" in flags:
    kind = "arm64 SVE"
  elif "asimd" in flags:
    kind = "arm64 NEON"
  else:
    kind = machine or "unknown"
  isa = next((w.split("=", 1)[1] for w in xla_flags.split()
              if w.startswith("--xla_cpu_max_isa=")), "")
  if isa:
    kind += f" ({isa} only for XLA: --xla_cpu_max_isa={isa})"
  return kind


def cpu_info(cpuinfo_path: str = "/proc/cpuinfo") -> dict[str, Any]:
  """The CPU from /proc/cpuinfo (its first processor): model name, family and model numbers,
  the vector extensions of VECTOR_FLAGS it has, and `cpu_kind`'s label. Where there is no
  such file (not Linux), the platform module's name and None for what it cannot tell."""
  fields: dict[str, str] = {}
  try:
    with open(cpuinfo_path, encoding="utf-8") as f:
      for line in f:
        if not line.strip():
          if fields:
            break  # the first processor is enough
          continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  flags = set((fields.get("flags") or fields.get("Features") or "").split())
  machine = platform.machine()
  number = lambda key: int(fields[key]) if fields.get(key, "").isdigit() else None
  return {
    "model_name": fields.get("model name") or platform.processor() or machine,
    "family": number("cpu family"),
    "model": number("model"),
    "vendor": fields.get("vendor_id") or fields.get("CPU implementer"),
    "vector_extensions": [f for f in VECTOR_FLAGS if f in flags] if flags else None,
    "kind": cpu_kind(flags, machine, os.environ.get("XLA_FLAGS", "")),
  }


def hardware() -> dict[str, Any]:
  """What ran the experiment: CPU (and its kind: `cpu_info`), cores, load, JAX backend and
  devices, date."""
  import jax

  try:
    load = os.getloadavg()[0]
  except OSError:
    load = None
  devices = jax.devices()
  info = cpu_info()
  return {
    "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    "cpu": cpu_model(),
    "cpu_kind": info["kind"],
    "cpu_family": info["family"],
    "cpu_model_number": info["model"],
    "cpu_vendor": info["vendor"],
    "cpu_vector_extensions": info["vector_extensions"],
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
  numbers = ", ".join(f"{name} {hw[key]}" for name, key in (("family", "cpu_family"),
                      ("model", "cpu_model_number")) if hw.get(key) is not None)
  extensions = hw.get("cpu_vector_extensions")
  detail = "; ".join(x for x in (hw.get("cpu_vendor"), numbers,
                                 extensions and ", ".join(extensions)) if x)
  return (
    f"- Date: {hw['date']}.\n"
    f"- CPU: `{hw['cpu']}`, {hw['cpu_count']} cores; load average (1 min) {load} when the "
    "report was written (the machine is shared: step times are noisy).\n"
    f"- CPU kind: **{hw.get('cpu_kind', 'unknown')}**" + (f" ({detail})" if detail else "")
    + ".\n"
    f"- JAX {hw['jax']}, backend `{hw['backend']}` ({hw['device_kind']}), "
    f"{hw['device_count']} device(s) in the reporting process; `XLA_FLAGS`="
    f"`{hw['xla_flags']}`; Python {hw['python']}.\n"
  )


# Environment variables that change which kernels the programs measured here run (XLA, torch,
# MKL, oneDNN, CTranslate2) or how they allocate memory: a command names those that are set.
KERNEL_ENV = ("XLA_FLAGS", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
              "CT2_FORCE_CPU_ISA", "GLIBC_TUNABLES", "OMP_NUM_THREADS")


def command_line(argv: Sequence[str] | None = None) -> str:
  """The running command, `[XLA_FLAGS=...] [nice -n N] python -m module args...`, with the
  KERNEL_ENV variables that are set (XLA_FLAGS even when empty) in front."""
  argv = list(sys.argv if argv is None else argv)
  prog = argv[0]
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  if spec is not None and spec.name and prog.endswith(".py"):
    head = ["python", "-m", spec.name]
  else:
    head = ["python", prog]
  env = [f"{name}={shlex.quote(os.environ[name])}" for name in KERNEL_ENV
         if name in os.environ and (os.environ[name] or name == "XLA_FLAGS")]
  niceness = os.nice(0)
  prefix = env + (["nice", "-n", str(niceness)] if niceness > 0 else [])
  return " ".join(prefix + [shlex.quote(a) for a in head + argv[1:]])


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def public_path(path: str) -> str:
  """A path inside the repository relative to it; any other by its last component."""
  if os.path.commonpath([ROOT, os.path.abspath(path)]) == ROOT:
    return os.path.relpath(path, ROOT)
  return os.path.basename(path)


def public_command(command: str, hide: Sequence[str] = ()) -> str:
  """A command without this machine's paths, for a report: the values of the `hide` flags as
  PY, every other absolute path (after `=` or `,`, or a whole word) through `public_path`."""
  words = shlex.split(command)
  for i, word in enumerate(words):
    flag = word.split("=", 1)[0]
    if flag in hide and "=" in word:
      words[i] = f"{flag}=PY"
    elif i and words[i - 1] in hide:
      words[i] = "PY"
    else:
      words[i] = re.sub(r"(^|[=,])(/[^=,]+)", lambda m: m[1] + public_path(m[2]), word)
  return shlex.join(words)


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


def _demote(text: str) -> str:
  """Markdown headings one level deeper (a report's body inside a section); code blocks as
  they are."""
  lines, code = [], False
  for line in text.split("\n"):
    code ^= line.startswith("```")
    lines.append("#" + line if not code and re.match(r"#{1,5} ", line) else line)
  return "\n".join(lines)


def _run_markdown(command: str | dict[str, str], body: Sequence[str], machine_note: str,
                  hw: dict[str, Any]) -> str:
  """The command(s), `## Machine` and the body of one run."""
  if isinstance(command, str):
    cmd = ["## Command\n", f"```\n{command}\n```\n"]
  else:
    cmd = ["## Commands\n"] + [f"{part}:\n\n```\n{c}\n```\n" for part, c in command.items()]
  return "\n".join([*cmd, "## Machine\n", hardware_markdown(hw) + machine_note, *body])


SECTION = re.compile(r"<!-- section: (.+?) -->\n(.*?)<!-- end of section: \1 -->\n", re.DOTALL)


def sections(markdown: str) -> dict[str, str]:
  """{name: markdown} of the sections of a report, in order."""
  return {m[1]: m[2] for m in SECTION.finditer(markdown)}


def write(path: str, title: str, intro: str, command: str | dict[str, str], body: Sequence[str],
          record: dict[str, Any] | None = None, *, section: str | None = None,
          machine_note: str = "") -> list[str]:
  """Writes a result: `path`.md and `path`.json (`path` without extension); returns both.

  The markdown is `# title`, the intro, the command (or {part: command} when parts ran
  separately), `## Machine` (date, CPU, its kind, cores, load, JAX: `hardware_markdown`, then
  `machine_note`) and `body`; the JSON is {"command", "hardware", **record}.

  With `section`, the run is one variant of the question: `## section` holds its command,
  machine and body (headings one level down), and the JSON's "sections"[section] its
  {"command", "hardware", **record}. The report's other sections are kept as they are, this
  one is replaced in place, or added at the end; title and intro are the latest run's.
  """
  import json

  hw = hardware()
  run = {"command": command, "hardware": hw, **(record or {})}
  text = _run_markdown(command, body, machine_note, hw)
  md_path, json_path = path + ".md", path + ".json"
  os.makedirs(os.path.dirname(os.path.abspath(md_path)), exist_ok=True)
  if section is None:
    markdown, data = f"# {title}\n\n{intro}\n\n{text}", run
  else:
    old = open(md_path, encoding="utf-8").read() if os.path.exists(md_path) else ""
    parts = sections(old)
    parts[section] = f"## {section}\n\n{_demote(text).rstrip()}\n\n"
    markdown = f"# {title}\n\n{intro}\n\n" + "".join(
      f"<!-- section: {name} -->\n{part}<!-- end of section: {name} -->\n\n"
      for name, part in parts.items())
    data = read_json(json_path)
    data = {"title": title, "sections": {**data.get("sections", {}), section: run}}
  with open(md_path, "w", encoding="utf-8") as f:
    f.write(markdown.rstrip() + "\n")
  with open(json_path, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1)
  return [md_path, json_path]


def read_json(path: str) -> dict[str, Any]:
  """The JSON object in `path`, or {} when there is no such file (a report's last records)."""
  import json

  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def grid(records: Sequence[dict[str, Any]], rows: str, cols: str,
         cell: Any) -> tuple[list[Any], list[Any], list[list[Any]]]:
  """Records pivoted: (row values, column values, cells); `cell(record)` or '-' if none."""
  row_values = sorted({r[rows] for r in records})
  col_values = list(dict.fromkeys(r[cols] for r in records))
  by = {(r[rows], r[cols]): r for r in records}
  table = [[cell(by[(rv, cv)]) if (rv, cv) in by else "-" for cv in col_values]
           for rv in row_values]
  return row_values, col_values, table


def plot_series(ax: Any, records: Sequence[dict[str, Any]], x: str, y: Any, group: Any = "kind",
                style: str = "o-", **kwargs: Any) -> None:
  """One line per group (a key or a function of the record): `y` (a key or function) against
  `x`, points with a None value left out."""
  key = group if callable(group) else (lambda r: r[group])
  value = y if callable(y) else (lambda r: r[y])
  for i, g in enumerate(dict.fromkeys(key(r) for r in records)):
    pts = [(r[x], value(r)) for r in records if key(r) == g and value(r) is not None]
    ax.plot([p for p, _ in pts], [v for _, v in pts], style, color=f"C{i}", label=str(g),
            **kwargs)


def finish_axes(axes: Any, xlabel: str | None = None, log2_x: bool = False, log_y: bool = False,
                legend_size: int = 8) -> None:
  """The common finish of a panel: labels, log scales, grid and legend."""
  for ax in axes:
    if xlabel:
      ax.set_xlabel(xlabel)
    if log2_x:
      ax.set_xscale("log", base=2)
    if log_y:
      ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=legend_size)
