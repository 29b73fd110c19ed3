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
  code = ("import transformer.model, transformer.attention, transformer.infer, transformer.train\n"
          "import transformer.data.input_pipeline\n"
          "print(transformer.model.__file__)")
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
  for root in ("transformer", "experiments", "configs", "tests"):
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


def test_experiments_and_library_have_no_import_cycle():
  graph = {m: {t for t, _ in e if t.startswith(("transformer", "experiments"))}
           for m, e in project_imports().items() if m.startswith(("transformer", "experiments"))}
  cycles = _find_cycles(graph)
  assert not cycles, cycles


# The one function that defines flags for its callers: the sweep CLIs call it at module level.
FLAG_HELPERS = {"experiments.sweeps.define_flags"}


def _is_flag_definition(node):
  if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
    return False
  owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
  return ((owner in ("flags", "config_flags") and node.func.attr.startswith("DEFINE_"))
          or f"experiments.{owner}.{node.func.attr}" in FLAG_HELPERS)


def flag_definitions(module, path):
  """(whether the module defines absl flags at its top level, so that importing it defines
  them; the functions that define flags inside their bodies, as module.function)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  top, inside = False, []
  for stmt in tree.body:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
      if any(_is_flag_definition(n) for n in ast.walk(stmt)):
        inside.append(f"{module}.{stmt.name}")
    elif any(_is_flag_definition(n) for n in ast.walk(stmt)):
      top = True
  return top, inside


def test_one_flag_style():
  """Flags are defined at module level, in command modules only, and no module or test imports
  a command module (two of them in one process would clash, and importing one would define
  flags as a side effect)."""
  commands, inside = set(), []
  for m in project_imports():
    path = os.path.join(REPO, *m.split(".")) + ".py"
    if not os.path.exists(path):
      path = os.path.join(REPO, *m.split("."), "__init__.py")
    top, functions = flag_definitions(m, path)
    commands |= {m} if top else set()
    inside += functions
  assert {"experiments.benchmark", "experiments.claims", "experiments.seq_len",
          "experiments.heads", "experiments.sweep", "transformer.main"} <= commands
  assert set(inside) == FLAG_HELPERS, inside
  bad = sorted({(m, t) for m, edges in project_imports().items()
                for t, _ in edges if t in commands and t != m})
  assert not bad, bad
