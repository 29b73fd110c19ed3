"""Profiler windows (transformer/profiling.py): the config field, and a trace of the steps of a
loop, local and on an object store (a whole training run is profiled in tests/test_compile.py)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import numbers as numbers_config
from transformer import storage
from transformer.errors import ConfigError
from transformer.profiling import Profiler, parse_steps
from transformer.training.validate import validate


def test_parse_steps():
  assert parse_steps("") is None
  assert parse_steps("200:205") == (200, 205)
  assert parse_steps("7:7") == (7, 7)
  for bad in ("200", "5:2", "0:3", "a:b", "1:2:3", "-1:4", ":4"):
    with pytest.raises(ValueError):
      parse_steps(bad)


@pytest.mark.parametrize("value", ["200", "5:2", "x"])
def test_a_bad_profile_steps_is_a_one_line_config_error(value):
  config = numbers_config.get_config("tiny")
  config.profile_steps = value
  with pytest.raises(ConfigError, match="^profile_steps=") as e:
    validate(config, 8)
  assert "\n" not in str(e.value)


def run_loop(profiler, steps):
  """A loop that calls the profiler as training does; returns its values and the calls it
  made between the profiler's start and stop."""
  step = jax.jit(lambda x: jnp.tanh(x @ x.T) + x)
  x = jnp.ones((8, 8)) / 8
  active = []
  profiler.step(0)
  for done in range(1, steps + 1):
    x = step(x)
    active.append(profiler.active)
    profiler.step(done, x)
  profiler.close(x)
  return np.asarray(x), active


def trace_files(root):
  return [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]


def test_profiler_traces_its_window_and_changes_nothing(tmp_path):
  plain, _ = run_loop(Profiler("", tmp_path / "plain"), 6)
  traced, active = run_loop(Profiler("2:4", tmp_path / "run"), 6)
  np.testing.assert_array_equal(plain, traced)
  # Steps 2, 3 and 4 were dispatched while the trace ran.
  assert active == [False, True, True, True, False, False]
  files = trace_files(tmp_path / "run" / "profile")
  assert any(f.endswith(".xplane.pb") for f in files), files
  assert any(f.endswith("perfetto_trace.json.gz") for f in files), files
  assert not (tmp_path / "plain" / "profile").exists()


def test_a_window_past_the_end_stops_with_the_loop(tmp_path):
  _, active = run_loop(Profiler("3:100", tmp_path), 4)
  assert active == [False, False, True, True]
  assert any(f.endswith(".xplane.pb") for f in trace_files(tmp_path / "profile"))


def test_a_gs_workdir_gets_the_trace_copied_up(gcs):
  workdir = gcs.path("profiled_run")
  run_loop(Profiler("1:2", workdir), 3)
  files = [str(p) for p in storage.as_path(workdir).glob("profile/plugins/profile/*/*")]
  assert any(f.endswith(".xplane.pb") for f in files), files
  assert any(f.endswith("perfetto_trace.json.gz") for f in files), files
