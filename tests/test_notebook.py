"""The Colab notebook's cells run top to bottom on CPU with the tiny config."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

from tests.xla_flags import FAST_COMPILE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_colab_notebook_runs_on_cpu(tmp_path, monkeypatch):
  monkeypatch.setenv("NOTEBOOK_CONFIG", "configs/numbers.py:tiny")
  monkeypatch.setenv("NOTEBOOK_WORKDIR", str(tmp_path / "run"))
  monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)
  monkeypatch.setenv("PYTHONPATH", REPO)
  nb = nbformat.read(os.path.join(REPO, "experiments", "colab_tpu.ipynb"), as_version=4)
  NotebookClient(nb, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": REPO}}).execute()
  outputs = "".join(
    o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
  )
  assert "test BLEU:" in outputs
  assert "configs/wmt.py:base" in outputs
  assert os.path.exists(tmp_path / "run" / "metrics.jsonl")
