"""Training-step benchmark: throughput, model FLOPs, and the fraction of the matmul rate.

    python -m experiments.benchmark --config=configs/wmt.py:base \
        --config.model.dtype=float32 --config.model.vocab_size=8192 --config.mesh.data=1 \
        --batch_size=32 --src_len=64 --tgt_len=64 --steps=5

Builds the project's `Trainer` on a mesh (by default over all devices), compiles its train
step for the given batch shapes ahead of time, reads XLA's memory analysis of the compiled
step, then runs warm-up steps and `--steps` timed steps on random token batches (ids in
[2, vocab), no padding). In the same run it measures the machine's float32 matmul rate, so that
the step can be reported as a fraction of it. The last line printed is one JSON object.

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
import os
import statistics
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from experiments import measure, report
from transformer.errors import fail

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Config file, e.g. configs/wmt.py:base.", lock_config=True
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Global batch size (rows).")
_SRC_LEN = flags.DEFINE_integer("src_len", 64, "Source tokens per row.")
_TGT_LEN = flags.DEFINE_integer("tgt_len", 64, "Target tokens per row.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps; 0 compiles only.")
_WARMUP = flags.DEFINE_integer(
  "warmup_steps", 2, "Untimed steps before the timed ones (the peer runs 2)."
)
_MATMUL_SIZE = flags.DEFINE_integer(
  "matmul_size", 2048, "n of the [n, n] @ [n, n] float32 product that measures the matmul rate."
)
_MATMUL_REPEATS = flags.DEFINE_integer("matmul_repeats", 5, "Timed matmuls (best is kept).")
_PRNG_IMPL = flags.DEFINE_enum(
  "prng_impl",
  None,
  ["threefry2x32", "rbg", "unsafe_rbg"],
  "Set jax_default_prng_impl (the dropout RNG) before building; default: JAX's own.",
)

FLAGS = flags.FLAGS


def run_benchmark(
  config: Any,
  batch_size: int,
  src_len: int,
  tgt_len: int,
  steps: int,
  warmup_steps: int = 2,
  matmul_size: int = 2048,
  matmul_repeats: int = 5,
) -> dict[str, Any]:
  """Compiles and times the train step; returns the JSON record (see the module docstring).

  Raises ConfigError for a config or shape the benchmark cannot run.
  """
  import jax
  import numpy as np

  from transformer import sharding as sharding_lib
  from transformer.errors import ConfigError
  from transformer.train import Trainer
  from transformer.validate import validate

  measure.check_at_least((
    ("--batch_size", batch_size, 1),
    ("--src_len", src_len, 1),
    ("--tgt_len", tgt_len, 1),
    ("--steps", steps, 0),
    ("--warmup_steps", warmup_steps, 0),
    ("--matmul_size", matmul_size, 1),
    ("--matmul_repeats", matmul_repeats, 1),
  ))
  with config.unlocked():
    config.data.vocab_size = config.model.vocab_size  # no data here: keep validation happy
  mc = validate(config, jax.device_count())
  if max(src_len, tgt_len) > mc.max_len:
    raise ConfigError(
      f"--src_len/--tgt_len ({src_len}/{tgt_len}) exceed model.max_len="
      f"{mc.max_len}: raise model.max_len or shorten them"
    )
  mesh = sharding_lib.make_mesh(config.mesh)
  dp = sharding_lib.data_parallel_size(mesh)
  if batch_size % dp:
    raise ConfigError(
      f"--batch_size={batch_size} is not divisible by the {dp} data-parallel "
      "devices (mesh.data x mesh.fsdp)"
    )

  trainer = Trainer(config, mesh, mc)
  n_params = measure.count_params(trainer.abstract_state.params)
  # With the batch's sharding, so that the jitted step called below finds this compilation in
  # its cache instead of compiling again.
  batch_sharding = sharding_lib.batch_sharding(mesh)
  shapes = {
    "inputs": jax.ShapeDtypeStruct((batch_size, src_len), np.int32, sharding=batch_sharding),
    "targets": jax.ShapeDtypeStruct((batch_size, tgt_len), np.int32, sharding=batch_sharding),
  }
  compiled, lower_s, xla_compile_s = measure.compile_timed(lambda: trainer.lower_train_step(shapes))

  flops = measure.model_flops_per_step(
    mc.d_model,
    mc.d_ff,
    mc.num_layers,
    mc.vocab_size,
    batch_size,
    src_len,
    tgt_len,
    attn_width=mc.num_heads * mc.head_dim,
  )
  tokens = batch_size * (src_len + tgt_len)
  record: dict[str, Any] = {
    "benchmark": "transformer train_step",
    "tokens_per_s": None,
    "step_s": None,
    "step_s_stat": "best",
    "step_s_median": None,
    "step_times_s": [],
    "step_cpu_s": None,
    "step_cpu_s_median": None,
    "first_step_s": None,
    "model_flops_per_step": flops,
    "achieved_flops_per_s": None,
    "matmul_flops_per_s": None,
    "fraction_of_matmul_peak": None,
    "tokens_per_step": tokens,
    "lower_s": lower_s,
    "compile_s": lower_s + xla_compile_s,
    "xla_compile_s": xla_compile_s,
    **measure.memory_stats(compiled),
    "batch_size": batch_size,
    "src_len": src_len,
    "tgt_len": tgt_len,
    "steps": steps,
    "warmup_steps": warmup_steps if steps else 0,
    "params": n_params,
    "d_model": mc.d_model,
    "layers": mc.num_layers,
    "heads": mc.num_heads,
    "head_dim": mc.head_dim,
    "d_ff": mc.d_ff,
    "vocab": mc.vocab_size,
    "dtype": str(mc.compute_dtype),
    "attention": mc.attention,
    "attention_chunk_size": mc.attention_chunk_size,
    "scan_layers": mc.scan_layers,
    "remat": mc.remat,
    "dropout": mc.dropout_rate,
    "attention_dropout": mc.attention_dropout_rate,
    "label_smoothing": float(config.label_smoothing),
    "pre_layer_norm": mc.pre_layer_norm,
    "share_embeddings": mc.share_embeddings,
    "prng_impl": str(jax.config.jax_default_prng_impl),
    "devices": jax.device_count(),
    "mesh": {k: int(v) for k, v in mesh.shape.items()},
    "backend": jax.default_backend(),
    "device_kind": jax.devices()[0].device_kind,
    "cpu": report.cpu_model(),
    "cpu_count": os.cpu_count(),
    "jax": jax.__version__,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }
  if steps == 0:
    return record

  state = trainer.init_state(int(config.seed))
  rng = jax.random.key(int(config.seed))
  host_rng = np.random.default_rng(int(config.seed))
  # Every batch is on the device before the clock starts: only the step is timed.
  batches = [
    sharding_lib.local_batch_to_global(
      measure.random_batch(host_rng, batch_size, src_len, tgt_len, mc.vocab_size), mesh
    )
    for _ in range(warmup_steps + steps)
  ]
  jax.block_until_ready(batches)
  state, metrics, times, cpu_times = measure.time_steps(trainer.train_step, state, batches, rng)
  record["first_step_s"] = times[0]
  timed, timed_cpu = times[warmup_steps:], cpu_times[warmup_steps:]
  loss = float(metrics["loss"] / metrics["tokens"])
  if not np.isfinite(loss):
    raise RuntimeError(f"the benchmark step produced a non-finite loss ({loss})")
  del state, batches

  matmul = measure.measure_matmul_flops(matmul_size, matmul_repeats)
  best = min(timed)
  record.update(
    {
      "tokens_per_s": tokens / best,
      "step_s": best,
      "step_s_median": statistics.median(timed),
      "step_times_s": timed,
      "step_cpu_s": min(timed_cpu),
      "step_cpu_s_median": statistics.median(timed_cpu),
      "achieved_flops_per_s": flops / best,
      "matmul_flops_per_s": matmul,
      "fraction_of_matmul_peak": flops / best / matmul,
      "matmul_size": matmul_size,
      "last_loss": loss,
    }
  )
  return record


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, but a bad flag or config file is one line and exit status 2."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    fail(str(e).strip().splitlines()[0])
  except Exception as e:  # noqa: BLE001 - a config file that fails to load or parse
    fail(f"--config: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}; fields are set with --config.field=value")
  if _CONFIG.value is None:
    fail("--config is required, e.g. --config=configs/wmt.py:base")
  import jax

  from transformer.errors import UserError

  if _PRNG_IMPL.value:
    jax.config.update("jax_default_prng_impl", _PRNG_IMPL.value)
  try:
    record = run_benchmark(
      _CONFIG.value,
      _BATCH_SIZE.value,
      _SRC_LEN.value,
      _TGT_LEN.value,
      _STEPS.value,
      _WARMUP.value,
      _MATMUL_SIZE.value,
      _MATMUL_REPEATS.value,
    )
  except UserError as e:
    fail(str(e))
  if record["step_s"] is not None:
    print(
      f"{record['tokens_per_s']:.0f} tokens/s, step {record['step_s'] * 1e3:.1f} ms (best of "
      f"{record['steps']}; median {record['step_s_median'] * 1e3:.1f} ms), "
      f"{record['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s = "
      f"{100 * record['fraction_of_matmul_peak']:.1f}% of the measured matmul rate "
      f"({record['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s)",
      flush=True,
    )
  print(
    f"compile {record['compile_s']:.1f} s, temp {record['temp_memory_bytes']} B, "
    f"peak {record['peak_memory_bytes']} B",
    flush=True,
  )
  print(json.dumps(record), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
