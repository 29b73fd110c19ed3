"""The model layout's parameters kept beside the compilation cache: read back the same as traced."""

import json
import logging

import jax

from configs import numbers as numbers_config
from transformer import sharding as sharding_lib
from transformer.training import layout as layout_lib
from transformer.training.layout import ModelLayout
from transformer.training.validate import validate


def _config(d_model=32):
  config = numbers_config.get_config("tiny")
  config.model.d_model = d_model
  # Every axis of the mesh used, so that the shardings differ between parameters.
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  return config


def _layout(config):
  return ModelLayout(config, sharding_lib.make_mesh(config.mesh),
                     validate(config, jax.device_count()))


def _described(layout):
  return [(path, a.shape, a.dtype, a.sharding)
          for path, a in jax.tree_util.tree_flatten_with_path(layout.abstract_params)[0]]


def test_a_kept_layout_is_read_back_as_traced_without_tracing(tmp_path, monkeypatch, caplog):
  config = _config()
  path = layout_lib.kept_parameter_layout(validate(config, jax.device_count()), str(tmp_path))
  monkeypatch.setattr(layout_lib, "kept_parameter_layout", lambda model_config: path)
  traced = _layout(config)
  assert any(len(set(s.spec) - {None}) > 0 for s in jax.tree.leaves(traced.param_shardings))
  with open(path) as f:
    assert len(json.load(f)) == len(jax.tree.leaves(traced.abstract_params))

  def no_trace(*args, **kwargs):
    raise AssertionError("the model was traced although its layout was kept")

  with monkeypatch.context() as m:
    m.setattr(jax, "eval_shape", no_trace)
    read = _layout(config)
  assert jax.tree.structure(read.abstract_params) == jax.tree.structure(traced.abstract_params)
  assert _described(read) == _described(traced)
  assert read.param_shardings == traced.param_shardings

  # A damaged file: a warning, and the model traced again to the same layout.
  with open(path, "w") as f:
    f.write('[["decoder/final_norm/bias", [32]')
  with caplog.at_level(logging.WARNING):
    again = _layout(config)
  assert "cannot be read" in caplog.text
  assert _described(again) == _described(traced)


def test_the_kept_layout_is_named_by_the_model(tmp_path):
  small = validate(_config(32), jax.device_count())
  wide = validate(_config(64), jax.device_count())
  path = layout_lib.kept_parameter_layout(small, str(tmp_path))
  assert path.startswith(str(tmp_path))
  assert path == layout_lib.kept_parameter_layout(small, str(tmp_path))
  assert path != layout_lib.kept_parameter_layout(wide, str(tmp_path))


def test_no_layout_is_kept_on_a_remote_cache():
  model_config = validate(_config(), jax.device_count())
  assert layout_lib.kept_parameter_layout(model_config, "gs://bucket/cache") is None
