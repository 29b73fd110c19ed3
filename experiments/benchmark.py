"""Training-step benchmark: throughput, model FLOPs, and the fraction of the matmul rate.

    python -m experiments.benchmark --config=configs/wmt.py:base \
        --config.model.dtype=float32 --config.model.vocab_size=8192 --config.mesh.data=1 \
        --batch_size=32 --src_len=64 --tgt_len=64 --steps=5

`step_cost.run_benchmark` compiles the project's train step ahead of time on the config's mesh,
reads XLA's memory analysis (`measure.memory_stats`: temp and peak bytes per device), times
`--warmup_steps` untimed and `--steps` timed steps on random batches, and measures the
machine's matmul rate in the same run. As the PyTorch peer (experiments/torch_peer.py), step_s
is the best timed step (median too), model FLOPs follow `hardware.model_flops_per_step`, and
the matmul rate is the best of `--matmul_repeats` [n, n] products; step_cpu_s (the least CPU
time of a step) moves less with other processes' load. `--config.data.vocab_size` follows the
model's (no data here). `--steps=0` compiles only. The last line printed is one JSON object.
"""

from __future__ import annotations

import json

from absl import app, flags
from ml_collections import config_flags

from transformer.errors import UserError, fail, parse_flags

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Config file, e.g. configs/wmt.py:base.", lock_config=True)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Global batch size (rows).")
_SRC_LEN = flags.DEFINE_integer("src_len", 64, "Source tokens per row.")
_TGT_LEN = flags.DEFINE_integer("tgt_len", 64, "Target tokens per row.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps; 0 compiles only.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 2,
                               "Untimed steps before the timed ones (the peer runs 2).")
_MATMUL_SIZE = flags.DEFINE_integer(
  "matmul_size", 2048, "n of the [n, n] @ [n, n] float32 product that measures the matmul rate.")
_MATMUL_REPEATS = flags.DEFINE_integer("matmul_repeats", 5, "Timed matmuls (best is kept).")
_MATMUL_DTYPE = flags.DEFINE_enum("matmul_dtype", "float32", ["float32", "bfloat16"],
                                  "Precision of the matmul that measures the machine's rate.")
_PACKED = flags.DEFINE_integer("packed_segments", 0, "Packed rows of this many segments per "
                               "side (segment ids and positions); 0: unpacked rows.")
_PROFILE_STEPS = flags.DEFINE_integer(
  "profile_steps", 0, "After the timed steps, this many more under the JAX profiler: the "
  "record's `profile` holds the costliest XLA ops and the share of each part of the model.")
_PRNG_IMPL = flags.DEFINE_enum(
  "prng_impl", None, ["threefry2x32", "rbg", "unsafe_rbg"],
  "Set jax_default_prng_impl (the dropout RNG) before building; default: JAX's own.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}; fields are set with --config.field=value")
  if _CONFIG.value is None:
    fail("--config is required, e.g. --config=configs/wmt.py:base")
  import jax

  from experiments import step_cost

  if _PRNG_IMPL.value:
    jax.config.update("jax_default_prng_impl", _PRNG_IMPL.value)
  try:
    r = step_cost.run_benchmark(_CONFIG.value, _BATCH_SIZE.value, _SRC_LEN.value, _TGT_LEN.value,
                                _STEPS.value, _WARMUP.value, _MATMUL_SIZE.value,
                                _MATMUL_REPEATS.value, _PACKED.value, _MATMUL_DTYPE.value,
                                _PROFILE_STEPS.value)
  except UserError as e:
    fail(str(e))
  if r["step_s"] is not None:
    print(f"{r['tokens_per_s']:.0f} tokens/s, step {r['step_s'] * 1e3:.1f} ms (best of "
          f"{r['steps']}; median {r['step_s_median'] * 1e3:.1f} ms), "
          f"{r['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s = "
          f"{100 * r['fraction_of_matmul_peak']:.1f}% of the measured matmul rate "
          f"({r['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s)", flush=True)
  print(f"compile {r['compile_s']:.1f} s, temp {r['temp_memory_bytes']} B, "
        f"peak {r['peak_memory_bytes']} B", flush=True)
  if r["profile"]:
    for c in r["profile"]["categories"]:
      print(f"{100 * c['share']:5.1f}%  {c['seconds'] * 1e3:8.1f} ms  {c['category']}", flush=True)
    for op in r["profile"]["top_ops"]:
      print(f"{100 * op['share']:5.1f}%  {op['seconds'] * 1e3:8.1f} ms  {op['op']} {op['shape']}: "
            f"{op['source']}", flush=True)
  print(json.dumps(r), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
