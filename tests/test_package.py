"""The package: installs with pip and imports from anywhere; the import graph stays clean."""

import ast
import os
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


def project_imports():
  """{module: [(imported module, imported name or None)]} for the project's own modules."""
  modules = {}
  for root in ("transformer", "experiments", "benchmarks", "configs", "tests"):
    for dirpath, _, files in os.walk(os.path.join(REPO, root)):
      for f in files:
        if f.endswith(".py"):
          rel = os.path.relpath(os.path.join(dirpath, f), REPO)[:-3].replace(os.sep, ".")
          modules[rel.removesuffix(".__init__")] = os.path.join(dirpath, f)
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


def test_the_benchmarks_build_on_the_experiments_tools_and_not_the_other_way():
  """benchmarks/ uses the measuring and reporting tools the experiments share (report,
  measure, step_cost); the library imports neither package, the experiments no benchmark."""
  wrong = sorted((m, t) for m, edges in project_imports().items() for t, _ in edges
                 if (m.startswith("transformer") and t.startswith(("experiments", "benchmarks")))
                 or (m.startswith("experiments") and t.startswith("benchmarks")))
  assert not wrong, wrong


# The one function that defines flags for its callers: the sweep commands call it when they run.
FLAG_HELPERS = {"experiments.sweep.define_flags"}
# The program's entry point: its flags are module-level, and nothing imports it.
ENTRY_POINT = "transformer.main"


def _is_flag_definition(node):
  if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
    return False
  owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
  return ((owner in ("flags", "config_flags") and node.func.attr.startswith("DEFINE_"))
          or f"experiments.{owner}.{node.func.attr}" in FLAG_HELPERS)


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
