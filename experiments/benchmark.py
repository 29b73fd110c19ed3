"""Training-step benchmark: throughput, model FLOPs, and the fraction of the matmul rate.

    python -m experiments.benchmark --config=configs/wmt.py:base \
        --config.model.dtype=float32 --config.model.vocab_size=8192 --config.mesh.data=1 \
        --batch_size=32 --src_len=64 --tgt_len=64 --steps=5

`step_cost.run_benchmark` builds the project's `Trainer` on a mesh (by default over all
devices), compiles its train step for the given batch shapes ahead of time, reads XLA's memory
analysis of the compiled step, then runs warm-up steps and `--steps` timed steps on random
token batches (ids in [2, vocab), no padding). In the same run it measures the machine's
float32 matmul rate, so that the step can be reported as a fraction of it. The last line
printed is one JSON object.

Measurements follow the project's PyTorch peer (`experiments/torch_peer.py`) so the two are
comparable in one session:
  - step_s is the BEST of the timed steps (the peer's `min`); the median is reported too.
    Each step is synchronised (`block_until_ready`) before its clock stops.
  - model_flops_per_step uses the peer's formula (`measure.model_flops_per_step`).
  - step_cpu_s is the least CPU time (all threads of this process) of a timed step: on a
    shared machine it moves less with other processes' load than the wall time does.
  - matmul_flops_per_s is the best of `--matmul_repeats` jitted `jnp.dot`s of two float32
    [n, n] matrices (n = `--matmul_size`, 2048 as the peer), after two warm-up products.

Memory fields come from `Compiled.memory_analysis()` (per device, bytes; `measure.memory_stats`):
  - temp_memory_bytes: XLA's temporary buffers (activations kept for the backward pass,
    gradients, workspace), excluding arguments and outputs.
  - peak_memory_bytes: arguments + outputs - aliased + temp, i.e. the inputs (parameters,
    optimiser state, batch), the outputs that do not reuse a donated input buffer, and the
    temporary allocation, all live at once: an upper bound of what the step holds.
  - xla_peak_memory_bytes: `memory_analysis().peak_memory_in_bytes` as reported. On XLA:CPU
    (jaxlib 0.10.2) it comes out about equal to the arguments and below temp_memory_bytes,
    so it does not include the temporaries there and is not used for peak_memory_bytes.

`--config.data.vocab_size` is set to the model's vocabulary (there is no data here), so that
only `--config.model.vocab_size` needs to be given. `--steps=0` compiles only: no parameters
are created, and the timing fields are null.
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
                                _MATMUL_REPEATS.value, _PACKED.value, _MATMUL_DTYPE.value)
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
  print(json.dumps(r), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
