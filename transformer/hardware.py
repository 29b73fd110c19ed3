"""What an accelerator can do and what a training step asks of it: peak rates and model FLOPs.

Model FLOPs utilisation (MFU) is the model FLOPs a run does per second over the peak of its
devices: `mfu(model_flops_per_step(P, S, T) * steps / seconds, device_kind, devices)`. The peak
is known for the GPUs and TPUs below; elsewhere (a CPU) MFU is None, never a guess.
"""

from __future__ import annotations

import re

# Dense bfloat16 peaks per chip, FLOP/s.
# NVIDIA data sheets: H100 SXM and H200 1,979 TFLOPS, H100 PCIe 1,513, A100 624, L4 242.5, all
# "with sparsity", which is twice the dense rate.
# Google Cloud TPU documentation (cloud.google.com/tpu/docs/v2, /v3, /v4, /v5e, /v5p, /v6e),
# bf16 peak compute per chip: v2 45, v3 123, v4 275, v5e 197, v5p 459, v6e (Trillium) 918
# TFLOPS. TPU keys are JAX's device kinds ("TPU v5 lite" is v5e, "TPU v5" is v5p, "TPU v6
# lite" is v6e; newer releases also say "TPU v5e", "TPU v5p", "TPU v6e").
PEAK_BF16 = {
  "H200": 989e12, "H100": 989e12, "H100 PCIe": 756e12, "A100": 312e12, "L4": 121e12,
  "TPU v2": 45e12, "TPU v3": 123e12, "TPU v4": 275e12,
  "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5": 459e12, "TPU v5p": 459e12,
  "TPU v6 lite": 918e12, "TPU v6e": 918e12,
}
# JAX devices per chip. A TPU v2 or v3 chip has two TensorCores, and JAX makes each its own
# device (a v2-8 shows 8 devices on 4 chips); v4 and v5p join their two cores into one device
# (megacore), v5e and v6e have one core per chip.
DEVICES_PER_CHIP = {"TPU v2": 2, "TPU v3": 2}


def peak_of(device_kind: str) -> float | None:
  """Dense bfloat16 peak FLOP/s of one JAX device of this kind; None where it is unknown.

  TPU kinds must match exactly ("TPU v4 lite", an inference chip, is not a "TPU v4"); a GPU
  name matches as a whole word of NVIDIA's longer kinds ("NVIDIA H100 80GB HBM3"), the
  longest name first (so "H100 PCIe" before "H100", and "L4" does not match "L40S").
  """
  if device_kind.startswith("TPU"):
    chip = PEAK_BF16.get(device_kind)
    return None if chip is None else chip / DEVICES_PER_CHIP.get(device_kind, 1)
  gpus = sorted((k for k in PEAK_BF16 if not k.startswith("TPU")), key=len, reverse=True)
  for name in gpus:
    if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w])", device_kind):
      return PEAK_BF16[name]
  return None


def model_flops_per_step(params: int, source_tokens: float, target_tokens: float) -> float:
  """Model FLOPs of a training step: 6 x parameters x tokens (Kaplan et al. 2020, sec. 2.1).

  The project's one FLOP count: the training loop's MFU, the step benchmarks and the GPU
  check all use it (the PyTorch peer, which imports nothing from the project, keeps a copy).
  Each parameter costs 2 FLOPs per token forward and 4 backward. In an encoder-decoder a
  token goes through about half of the parameters: a source token through the encoder, a
  target token through the decoder and the output layer. So tokens = (source + target) / 2,
  which is exact (bar attention and normalisation) when both sides are equally long; the
  attention products (Q K^T, weights x V) are not counted, within 3% for the base model on
  64-token rows (tests/test_hardware.py).

  Args:
    params: the model's parameters (`model_family.param_count`).
    source_tokens, target_tokens: tokens of the step's batch (or of several steps).
  """
  return 6.0 * params * (source_tokens + target_tokens) / 2


def mfu(model_flops_per_s: float, device_kind: str, num_devices: int) -> float | None:
  """Model FLOPs per second over the peak of `num_devices` devices; None where it is unknown."""
  peak = peak_of(device_kind)
  return None if peak is None else model_flops_per_s / (peak * num_devices)
