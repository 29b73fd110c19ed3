"""How many CPU devices translation takes (transformer/cpu_devices.py). That the outputs do not
depend on it is tested end to end in tests/test_corpus.py."""

import pytest
from ml_collections import config_dict

from transformer import cpu_devices
from transformer.errors import UserError


def mesh(data=-1, fsdp=1, tensor=1):
  return config_dict.ConfigDict({"data": data, "fsdp": fsdp, "tensor": tensor})


def config(batch_size=64):
  return config_dict.ConfigDict({"decode": {"batch_size": batch_size}, "mesh": mesh()})


@pytest.mark.parametrize("cores,batch_size,expected", [
  (1, 64, 1), (2, 64, 2), (16, 64, 8), (16, 256, 16), (4, 8, 1), (4, 16, 2), (2, 4, 1)])
def test_one_device_per_core_each_with_eight_sentences_of_a_batch(cores, batch_size, expected):
  assert cpu_devices.translation_devices(cores, batch_size, mesh()) == expected


@pytest.mark.parametrize("axes", [dict(data=1), dict(fsdp=-1, data=1), dict(tensor=2),
                                  dict(fsdp=2)])
def test_a_mesh_that_is_not_data_parallel_alone_keeps_one_device(axes):
  assert cpu_devices.translation_devices(8, 64, mesh(**axes)) == 1


def test_a_requested_count_below_one_is_refused():
  with pytest.raises(UserError, match="--cpu_devices=0: must be at least 1"):
    cpu_devices.use(0, config(), translating=True)


def test_the_flag_and_xla_flags_together_are_refused(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", f"{cpu_devices.FORCE_FLAG}=8")
  with pytest.raises(UserError, match="--cpu_devices=2 and XLA_FLAGS"):
    cpu_devices.use(2, config(), translating=True)


def test_the_default_leaves_jax_alone_unless_translating_without_a_set_count(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
  assert cpu_devices.use(None, config(), translating=False) is None
  assert cpu_devices.use(None, None, translating=True) is None
  monkeypatch.setenv("XLA_FLAGS", f"{cpu_devices.FORCE_FLAG}=8")
  assert cpu_devices.use(None, config(), translating=True) is None
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "3")
  assert cpu_devices.use(None, config(), translating=True) is None
