"""Training-step benchmark: throughput, model FLOPs, and the fraction of the matmul rate.

    python -m benchmarks.train_step --config=configs/wmt.py:base \
        --config.model.dtype=float32 --config.model.vocab_size=8192 --config.mesh.data=1 \
        --batch_size=32 --src_len=64 --tgt_len=64 --steps=5

`run_benchmark` compiles the project's train step ahead of time on the config's mesh
(`step_cost.measure_step`), reads XLA's memory analysis (`measure.memory_stats`: temp and
peak bytes per device), times `--warmup_steps` untimed and `--steps` timed steps on random
batches, and measures the machine's matmul rate in the same run. As the PyTorch peer
(benchmarks/torch_peer.py), step_s is the best timed step (median too), model FLOPs follow
`hardware.model_flops_per_step`, and the matmul rate is the best of `--matmul_repeats` [n, n]
products; step_cpu_s (the least CPU time of a step) moves less with other processes' load.
`--config.data.vocab_size` follows the model's (no data here). `--steps=0` compiles only. The
last line printed is one JSON object.
"""

from __future__ import annotations

import json
import os
from typing import Any

from measuring import measure, report, step_cost
from transformer import hardware
from transformer.errors import UserError, fail, flags_parser


def run_benchmark(config: Any, batch_size: int, src_len: int, tgt_len: int, steps: int,
                  warmup_steps: int = 2, matmul_size: int = 2048, matmul_repeats: int = 5,
                  packed_segments: int = 0, matmul_dtype: str = "float32",
                  profile_steps: int = 0) -> dict[str, Any]:
  """The benchmark's JSON record: `step_cost.measure_step` on the config's mesh, the model
  FLOPs (`hardware.model_flops_per_step`, the training loop's count) and their fraction of
  the matmul rate measured in `matmul_dtype`. Packed rows (`packed_segments` > 0) count as
  many tokens as unpacked rows of the same shape.
  `profile_steps` > 0 adds the `op_profile` of that many more steps (`measure_step`).

  Raises ConfigError for a config or shape the benchmark cannot run.
  """
  import jax

  from transformer import sharding as sharding_lib
  from transformer.errors import ConfigError
  from transformer.training.validate import validate

  measure.check_at_least((("--batch_size", batch_size, 1), ("--src_len", src_len, 1),
                          ("--tgt_len", tgt_len, 1), ("--steps", steps, 0),
                          ("--warmup_steps", warmup_steps, 0), ("--matmul_size", matmul_size, 1),
                          ("--matmul_repeats", matmul_repeats, 1),
                          ("--packed_segments", packed_segments, 0),
                          ("--profile_steps", profile_steps, 0)))
  with config.unlocked():
    config.data.vocab_size = config.model.vocab_size  # no data here: keep validation happy
  mc = validate(config, jax.device_count())
  if max(src_len, tgt_len) > mc.max_len:
    raise ConfigError(f"--src_len/--tgt_len ({src_len}/{tgt_len}) exceed model.max_len="
                      f"{mc.max_len}: raise model.max_len or shorten them")
  mesh = sharding_lib.make_mesh(config.mesh)
  dp = sharding_lib.data_parallel_size(mesh)
  if batch_size % dp:
    raise ConfigError(f"--batch_size={batch_size} is not divisible by the {dp} data-parallel "
                      "devices (mesh.data x mesh.fsdp)")
  step = step_cost.measure_step(config, mc, batch_size, src_len, tgt_len, steps=steps,
                                warmup=warmup_steps, segments=packed_segments,
                                profile_steps=profile_steps)
  flops = hardware.model_flops_per_step(step["params"], batch_size * src_len,
                                        batch_size * tgt_len)
  tokens = batch_size * (src_len + tgt_len)
  record = {
    "benchmark": "transformer train_step", "step_s_stat": "best",
    "model_flops_per_step": flops, "tokens_per_step": tokens, **step,
    "warmup_steps": warmup_steps if steps else 0, "d_model": mc.d_model,
    "layers": mc.num_layers, "heads": mc.num_heads, "head_dim": mc.head_dim, "d_ff": mc.d_ff,
    "vocab": mc.vocab_size, "dtype": str(mc.compute_dtype), "attention": mc.attention,
    "attention_chunk_size": mc.attention_chunk_size, "scan_layers": mc.scan_layers,
    "remat": mc.remat, "dropout": mc.dropout_rate,
    "attention_dropout": mc.attention_dropout_rate,
    "label_smoothing": float(config.label_smoothing), "pre_layer_norm": mc.pre_layer_norm,
    "share_embeddings": mc.share_embeddings, "prng_impl": str(jax.config.jax_default_prng_impl),
    "devices": jax.device_count(), "mesh": {k: int(v) for k, v in mesh.shape.items()},
    "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
    "cpu": report.cpu_model(), "cpu_kind": report.cpu_info()["kind"],
    "cpu_count": os.cpu_count(), "jax": jax.__version__,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "tokens_per_s": None, "achieved_flops_per_s": None, "matmul_flops_per_s": None,
    "fraction_of_matmul_peak": None,
  }
  if record["step_s"] is not None:
    matmul = measure.measure_matmul_flops(matmul_size, matmul_repeats, matmul_dtype)
    best = record["step_s"]
    record.update(tokens_per_s=tokens / best, achieved_flops_per_s=flops / best,
                  matmul_flops_per_s=matmul, fraction_of_matmul_peak=flops / best / matmul,
                  matmul_size=matmul_size, matmul_dtype=matmul_dtype)
  return record


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags

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

    if _PRNG_IMPL.value:
      jax.config.update("jax_default_prng_impl", _PRNG_IMPL.value)
    try:
      r = run_benchmark(_CONFIG.value, _BATCH_SIZE.value, _SRC_LEN.value, _TGT_LEN.value,
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
        print(f"{100 * c['share']:5.1f}%  {c['seconds'] * 1e3:8.1f} ms  {c['category']}",
              flush=True)
      for op in r["profile"]["top_ops"]:
        print(f"{100 * op['share']:5.1f}%  {op['seconds'] * 1e3:8.1f} ms  {op['op']} "
              f"{op['shape']}: {op['source']}", flush=True)
    print(json.dumps(r), flush=True)

  app.run(main, flags_parser=flags_parser())
