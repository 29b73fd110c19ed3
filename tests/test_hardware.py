"""Peak rates by device kind, model FLOPs, and MFU and the real-token fraction of the progress
line (transformer/hardware.py, train.Meter)."""

import numpy as np
import pytest

from configs import wmt as wmt_config
from measuring import measure
from transformer import hardware
from transformer.training.train import Meter


@pytest.mark.parametrize("kind,peak", [
  ("NVIDIA H100 80GB HBM3", 989e12),
  ("NVIDIA H100 PCIe", 756e12),
  ("NVIDIA H200", 989e12),
  ("NVIDIA A100-SXM4-80GB", 312e12),
  ("NVIDIA L4", 121e12),
  ("NVIDIA L40S", None),  # not an L4
  ("TPU v2", 22.5e12),  # a JAX device is one of the chip's two cores
  ("TPU v3", 61.5e12),
  ("TPU v4", 275e12),  # megacore: one device per chip
  ("TPU v4 lite", None),
  ("TPU v5 lite", 197e12),
  ("TPU v5e", 197e12),
  ("TPU v5", 459e12),
  ("TPU v5p", 459e12),
  ("TPU v6 lite", 918e12),
  ("cpu", None),
])
def test_peak_of_a_device_kind(kind, peak):
  assert hardware.peak_of(kind) == peak


def full_count(d, f, layers, vocab, batch, src_len, tgt_len):
  """Every matrix product of a training step counted (2 FLOPs per multiply-add, 3x for forward
  and backward), attention included: the reference the approximation is checked against."""
  encoder = layers * (4 * d * d + 2 * d * f)  # Q, K, V, O and the two FFN matrices
  decoder = layers * (8 * d * d + 2 * d * f) + d * vocab  # self + cross + FFN + logits
  forward = 2 * batch * (src_len * encoder + tgt_len * decoder)
  forward += 2 * 2 * batch * d * layers * (src_len**2 + tgt_len**2 + tgt_len * src_len)
  return 3 * forward


@pytest.mark.parametrize("length", [32, 64])
def test_model_flops_match_the_full_count_for_equal_sides(length):
  """6 x parameters x (source + target) / 2 against every product counted (attention included)
  for the base model, 64 rows of `length` tokens per side."""
  config = wmt_config.get_config("base")
  mc = config.model
  full = full_count(mc.d_model, mc.d_ff, mc.num_layers, mc.vocab_size, 64, length, length)
  approx = hardware.model_flops_per_step(measure.param_count(config), 64 * length, 64 * length)
  assert abs(approx / full - 1) < 0.03


def test_mfu_is_model_flops_over_the_peak_of_all_devices():
  assert hardware.mfu(197e12, "TPU v5 lite", 4) == pytest.approx(0.25)
  assert hardware.mfu(1e12, "cpu", 8) is None


def metrics(tokens, source_tokens):
  return {"loss": np.float32(2.0 * tokens), "nll": np.float32(tokens), "correct": np.float32(0),
          "tokens": np.float32(tokens), "source_tokens": np.float32(source_tokens),
          "grad_norm": np.float32(1), "param_norm": np.float32(1), "nonfinite": np.float32(0)}


def test_meter_reports_the_real_token_fraction_and_mfu():
  params, peak = 1000, 1e9
  meter = Meter(0, params, peak)
  meter.step(metrics(30, 40), positions=100)
  meter.step(metrics(10, 20), positions=100)
  record = meter.record(2, 1e-3)
  assert record["train/real_token_fraction"] == pytest.approx(100 / 200)
  # tokens/s and MFU are over the same seconds: MFU = 6 P (S + T) / 2 / seconds / peak.
  seconds = 100 / record["train/tokens_per_s"]
  assert record["train/mfu"] == pytest.approx(6 * params * 100 / 2 / seconds / peak)


def test_meter_leaves_out_mfu_where_the_peak_is_unknown():
  meter = Meter(0, 1000, None)
  meter.step(metrics(30, 40), positions=80)
  record = meter.record(1, 1e-3)
  assert "train/mfu" not in record and record["train/real_token_fraction"] == 70 / 80
