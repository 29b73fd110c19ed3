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


def defines_flags_on_import(path):
  """Whether a module defines absl flags at its top level (`flags.DEFINE_...` outside functions),
  so that importing it defines them: two such modules in one process would clash."""
  with open(path) as f:
    tree = ast.parse(f.read())
  for stmt in tree.body:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
      continue
    if isinstance(stmt, ast.If) and "__main__" in ast.unparse(stmt.test):
      continue  # runs only as the program, not on import
    for node in ast.walk(stmt):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and isinstance(node.func.value, ast.Name)
          and node.func.value.id in ("flags", "config_flags")
          and node.func.attr.startswith("DEFINE_")):
        return True
  return False


def test_no_experiment_imports_a_module_that_defines_flags():
  """Commands define their flags; libraries (measure, report, sweep, ...) are imported instead."""
  flag_modules = set()
  for m in project_imports():
    path = os.path.join(REPO, *m.split(".")) + ".py"
    if not os.path.exists(path):
      path = os.path.join(REPO, *m.split("."), "__init__.py")
    if defines_flags_on_import(path):
      flag_modules.add(m)
  assert {"experiments.benchmark", "transformer.main"} <= flag_modules  # the check sees them
  bad = sorted({(m, t) for m, edges in project_imports().items() if m.startswith("experiments")
               for t, _ in edges if t in flag_modules and t != m})
  assert not bad, bad
