"""The package: installs with pip and imports from anywhere; the import graph stays clean."""

import ast
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pip_install_then_import_from_another_directory(tmp_path):
  source = tmp_path / "source"  # a copy, so the build leaves nothing in the checkout
  source.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(os.path.join(REPO, name), source / name)
  shutil.copytree(os.path.join(REPO, "transformer"), source / "transformer",
                  ignore=shutil.ignore_patterns("__pycache__"))
  target = tmp_path / "site"
  proc = subprocess.run(
    [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
     f"--target={target}", str(source)], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  code = ("import transformer.nn.model, transformer.nn.attention, transformer.infer\n"
          "import transformer.training.train\n"
          "import transformer.data.input_pipeline\n"
          "print(transformer.nn.model.__file__)")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["PYTHONPATH"] = str(target)
  proc = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().startswith(str(target))


def _module_paths():
  """{module: its file} for the project's own modules."""
  modules = {}
  for root in ("transformer", "measuring", "experiments", "benchmarks", "configs", "tests"):
    for dirpath, _, files in os.walk(os.path.join(REPO, root)):
      for f in files:
        if f.endswith(".py"):
          rel = os.path.relpath(os.path.join(dirpath, f), REPO)[:-3].replace(os.sep, ".")
          modules[rel.removesuffix(".__init__")] = os.path.join(dirpath, f)
  return modules


def project_imports():
  """{module: [(imported module, imported name or None)]} for the project's own modules."""
  modules = _module_paths()
  graph = {}
  for name, path in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read())
    edges = []
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for alias in node.names:
          full = f"{node.module}.{alias.name}"
          if full in modules:
            edges.append((full, None))
          elif node.module in modules:
            edges.append((node.module, alias.name))
      elif isinstance(node, ast.Import):
        edges += [(a.name, None) for a in node.names if a.name in modules]
    graph[name] = edges
  return graph


def test_no_module_imports_another_modules_private_name():
  private = [(m, f"{target}.{name}") for m, edges in project_imports().items()
             for target, name in edges if name and name.startswith("_") and target != m]
  assert not private, private


def _find_cycles(graph):
  """Import cycles of {module: {imported modules}}, each as a path ending where it started."""
  state, cycles = {}, []

  def visit(m, path):
    state[m] = "open"
    for t in sorted(graph.get(m, ())):
      if state.get(t) == "open":
        cycles.append(path[path.index(t):] + [t])
      elif t not in state:
        visit(t, path + [t])
    state[m] = "done"

  for m in sorted(graph):
    if m not in state:
      visit(m, [m])
  return cycles


def test_the_library_has_no_import_cycle():
  graph = {m: {t for t, _ in e if t.startswith("transformer")}
           for m, e in project_imports().items() if m.startswith("transformer")}
  cycles = _find_cycles(graph)
  assert not cycles, cycles


def test_experiments_benchmarks_and_library_have_no_import_cycle():
  packages = ("transformer", "experiments", "benchmarks")
  graph = {m: {t for t, _ in e if t.startswith(packages)}
           for m, e in project_imports().items() if m.startswith(packages)}
  cycles = _find_cycles(graph)
  assert not cycles, cycles


def test_experiments_and_benchmarks_share_the_measuring_tools_and_nothing_else():
  """measuring/ (report, measure, step_cost) serves experiments/ and benchmarks/ and imports
  neither; the library imports none of the three; the experiments no benchmark and the
  benchmarks no experiment."""
  above = {"transformer": ("measuring", "experiments", "benchmarks"),
           "measuring": ("experiments", "benchmarks"),
           "experiments": ("benchmarks",), "benchmarks": ("experiments",)}
  wrong = sorted((m, t) for m, edges in project_imports().items() for t, _ in edges
                 if t.startswith(above.get(m.split(".")[0], ())))
  assert not wrong, wrong


def readme_layers():
  """The README's table of the library's layers, bottom up: [(layer, {module, ...})], each
  module as `transformer.x.y`; a directory names every module in it."""
  with open(os.path.join(REPO, "README.md")) as f:
    text = f.read()
  table = text[text.index("| layer | modules | what |"):]
  layers = []
  for row in table.splitlines()[2:]:
    if not row.startswith("|"):
      break
    name, listed = row.split("|")[1:3]
    entries, directory = re.findall(r"`([^`]+)`", listed), ""
    if not entries or not entries[0].startswith("transformer/"):
      continue
    modules = set()
    for entry in entries:
      if "/" in entry:
        directory = entry if entry.endswith("/") else os.path.dirname(entry) + "/"
      path = entry if "/" in entry else directory + entry
      if path.endswith("/"):
        for f in os.listdir(os.path.join(REPO, path)):
          if f.endswith(".py") and f != "__init__.py":
            modules.add((path + f[:-3]).replace("/", "."))
      else:
        modules.add(path[:-3].replace("/", "."))
    layers.append((name.strip(), modules))
  return layers


def test_the_readme_layers_hold_every_module_and_each_imports_only_its_own_or_lower():
  """The README's table of layers (base, nn, data, decoding, training, interop, program) is the
  import order: a module imports modules of its own layer or of the layers below it, never
  above, and every module of the library is in exactly one layer."""
  layers = readme_layers()
  assert [n for n, _ in layers] == ["base", "nn", "data", "decoding", "training", "interop",
                                    "program"]
  level = {}
  for i, (_, modules) in enumerate(layers):
    for m in modules:
      assert m not in level, f"{m} is in two layers"
      level[m] = i
  graph = project_imports()
  library = {m for m in graph if m.startswith("transformer.")
             and not any(m == p for p in ("transformer.nn", "transformer.data",
                                          "transformer.decoding", "transformer.training",
                                          "transformer.interop"))}
  assert library == set(level), (sorted(library - set(level)), sorted(set(level) - library))
  upward = sorted((m, t, layers[level[t]][0]) for m in library for t, _ in graph[m]
                  if t in level and level[t] > level[m])
  assert not upward, upward


# (`.lock` is left out: other lock files end with it.)
WORKDIR_FILES = ("checkpoints", "buckets.json", "metrics.jsonl", "translations", "spm.model",
                 "config.json")


def test_each_workdir_file_is_named_in_the_workdir_module_only():
  """transformer/workdir.py names the workdir's files; no other module of the library,
  the experiments or the benchmarks spells one (Hugging Face's own `config.json` of a Marian
  model directory and CTranslate2's `spm.model` in interop/ are other directories' files)."""
  spelled = []
  for m, path in _module_paths().items():
    if not m.startswith(("transformer", "experiments", "benchmarks", "measuring")):
      continue
    if m == "transformer.workdir":
      continue
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Constant) and node.value in WORKDIR_FILES:
        other_directory = m.startswith("transformer.interop") and node.value in (
          "config.json", "spm.model")
        if not other_directory:
          spelled.append((m, node.value, node.lineno))
  assert not spelled, spelled


# The one function that defines flags for its callers: the sweep commands call it when they run.
FLAG_HELPERS = {"experiments.sweep.define_flags"}
# The program's entry point: its flags are module-level, and nothing imports it.
ENTRY_POINT = "transformer.main"


def _is_flag_definition(node):
  """absl's DEFINE_* calls, and calls of the FLAG_HELPERS functions (by their name)."""
  if not isinstance(node, ast.Call):
    return False
  helpers = {h.rsplit(".", 1)[1] for h in FLAG_HELPERS}
  if isinstance(node.func, ast.Name):
    return node.func.id in helpers
  if not isinstance(node.func, ast.Attribute):
    return False
  owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
  return ((owner in ("flags", "config_flags") and node.func.attr.startswith("DEFINE_"))
          or node.func.attr in helpers)


def _is_main_guard(stmt):
  return (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare)
          and ast.unparse(stmt.test) in ("__name__ == '__main__'", '__name__ == "__main__"'))


def flag_definitions(module, path):
  """Where a module defines absl flags: (at import, when run as a command, in the bodies of
  these functions as module.function)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  at_import, when_run, inside = False, False, []
  for stmt in tree.body:
    found = any(_is_flag_definition(n) for n in ast.walk(stmt))
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
      inside += [f"{module}.{stmt.name}"] if found else []
    elif _is_main_guard(stmt):
      when_run = when_run or found
    else:
      at_import = at_import or found
  return at_import, when_run, inside


def module_path(module):
  path = os.path.join(REPO, *module.split(".")) + ".py"
  return path if os.path.exists(path) else os.path.join(REPO, *module.split("."), "__init__.py")


def test_a_command_is_one_file_whose_flags_exist_only_when_it_runs():
  """A command's flags and `main` are under `if __name__ == "__main__":` (t5x's train.py
  style), so importing it defines no flag: tests and other modules import its functions, and
  two commands never clash in one process. The entry point transformer/main.py is the one
  module with flags at import, and nothing imports it."""
  at_import, commands, inside = set(), set(), []
  for m in project_imports():
    top, when_run, functions = flag_definitions(m, module_path(m))
    at_import |= {m} if top else set()
    commands |= {m} if when_run else set()
    inside += functions
  assert at_import == {ENTRY_POINT}, at_import
  assert {"experiments.heads", "experiments.sweep", "experiments.seq_len", "experiments.claims",
          "experiments.attention_maps", "benchmarks.train_step"} <= commands
  assert set(inside) == FLAG_HELPERS, inside
  importers = sorted(m for m, edges in project_imports().items()
                     if any(t == ENTRY_POINT for t, _ in edges) and m != ENTRY_POINT)
  assert not importers, importers
