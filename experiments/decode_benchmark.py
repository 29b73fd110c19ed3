"""Decoding-speed benchmark: KV-cached greedy and beam search against uncached greedy decoding.

    python -m experiments.decode_benchmark --config=configs/wmt.py:base \
        --batch_size=8 --src_len=32 --out_len=64 --beam_size=4 --repeats=3

With random parameters and random source batches (ids in [2, vocab), EOS = 1 last, no
padding) it compiles, warms up and then times three decoders, each producing exactly
`--out_len` tokens per sentence:

  - cached_greedy: the path of `transformer.translate.decode_tokens` with beam 1 (encode once,
    then `transformer.decode.greedy_decode` over the model's KV cache, one token per step);
  - cached_beam: the same path with `beam_search` and `--beam_size` beams;
  - uncached_greedy: the naive decoder, one jitted `lax.fori_loop` whose step t re-runs the
    whole decoder (`Transformer.decode_logits`) on a fixed-length [b, out_len] input holding
    the tokens produced so far (positions after t hold 0; causality makes them irrelevant) and
    takes position t's logits.

So that every decoder runs the same number of steps, the outputs are forced to be `out_len`
tokens long: before the last step the EOS and padding logits are set to -inf, and the last
token is the EOS (the decoders' own `max_lengths` rule). The cached path is the glue of
`decode_tokens`, re-implemented here only to add this suppression; the search itself is the
project's `greedy_decode` / `beam_search` and the cache is the model's. The greedy decoders
must agree token for token (`same_tokens`); their outputs are compared on every batch run.

Times are the BEST of `--repeats` timed runs (median also reported), each run synchronised
before its clock stops; the three decoders are interleaved run by run, so that a load change
on a shared machine hits them alike. sentences/s = batch / time; tokens/s = batch * out_len /
time (output tokens, whatever the number of beams). `speedup_cached_vs_uncached_greedy` is
the uncached greedy time over the cached greedy time. The last line printed is one JSON object.

Defaults on top of the config (each one yields to an explicit `--config.model.<field>`):
the compute dtype is float32 on CPU (bfloat16 matmuls are slow there), and the WMT configs'
37000-token vocabulary is replaced by 8192 (`DEFAULT_VOCAB_SIZE`).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments import measure, report
from transformer import decode as decode_lib
from transformer.errors import ConfigError, UserError, fail
from transformer.model import ModelConfig
from transformer.model_family import build_model
from transformer.translate import init_cache

Array = jax.Array

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "wmt.py") + ":base"
PAD_ID, EOS_ID = 0, 1
WMT_VOCAB_SIZE = 37000  # the paper's shared BPE vocabulary, as in configs/wmt.py
DEFAULT_VOCAB_SIZE = 8192  # what the benchmark uses instead, unless the command line sets it
MODES = ("cached_greedy", "cached_beam", "uncached_greedy")


def suppress_end(logits: Array, step: Array, out_len: int) -> Array:
  """Sets the EOS and padding logits to -inf before step out_len - 1.

  logits float [b, V]; step int scalar or [b] (broadcast over the vocabulary). At the last
  step the logits are returned unchanged (the decoders force the EOS there).
  """
  vocab = jnp.arange(logits.shape[-1])
  banned = (vocab == EOS_ID) | (vocab == PAD_ID)
  early = jnp.asarray(step)[..., None] < out_len - 1
  return jnp.where(early & banned, -jnp.inf, logits)


def cached_decode(
  params: Any, inputs: Array, mc: ModelConfig, *, beam_size: int, alpha: float, out_len: int
) -> Array:
  """`translate.decode_tokens` with outputs of exactly out_len tokens: int32 [b, out_len].

  inputs int32 [b, s]. beam_size 1 runs `greedy_decode`, more runs `beam_search` (best beam
  returned). The step counter that decides the suppression travels with the model's cache as
  a batch-major leaf, so beam search tiles and reorders it like the rest of the cache.
  """
  model = build_model(mc)
  step_model = build_model(mc, incremental=True)
  batch = inputs.shape[0]
  encoded = model.apply({"params": params}, inputs, method=type(model).encode)
  cache = (init_cache(mc, batch, inputs.shape[1], out_len), jnp.zeros((batch,), jnp.int32))
  if beam_size > 1:
    encoded, inputs = decode_lib.tile_beams((encoded, inputs), beam_size)

  def tokens_to_logits(ids: Array, cache: Any) -> tuple[Array, Any]:
    model_cache, step = cache
    logits, mutated = step_model.apply(
      {"params": params, "cache": model_cache},
      encoded,
      inputs,
      ids,
      method=type(step_model).decode_logits,
      mutable=["cache"],
    )
    return suppress_end(logits[:, -1, :], step, out_len), (mutated["cache"], step + 1)

  max_lengths = jnp.full((batch,), out_len, jnp.int32)
  if beam_size == 1:
    return decode_lib.greedy_decode(
      tokens_to_logits,
      cache,
      batch_size=batch,
      max_lengths=max_lengths,
      max_len=out_len,
      eos_id=EOS_ID,
    )
  seqs, _ = decode_lib.beam_search(
    tokens_to_logits,
    cache,
    batch_size=batch,
    beam_size=beam_size,
    alpha=alpha,
    max_lengths=max_lengths,
    max_len=out_len,
    eos_id=EOS_ID,
  )
  return seqs[:, 0]


def uncached_greedy_decode(
  params: Any, inputs: Array, mc: ModelConfig, *, out_len: int
) -> Array:
  """Greedy decoding that re-runs the decoder on the whole prefix at every step.

  inputs int32 [b, s] -> int32 [b, out_len], the same tokens as `cached_decode` with beam 1.
  Step t feeds the decoder the fixed-length input [0, y_0, ..., y_{t-1}, 0, ...] (the output
  so far shifted right) and reads the logits at position t.
  """
  model = build_model(mc)
  batch = inputs.shape[0]
  encoded = model.apply({"params": params}, inputs, method=type(model).encode)

  def step(t: Array, seqs: Array) -> Array:
    tgt_in = jnp.pad(seqs, ((0, 0), (1, 0)))[:, :-1]  # [b, out_len]; later positions are 0
    logits = model.apply(
      {"params": params}, encoded, inputs, tgt_in, method=type(model).decode_logits
    )  # [b, out_len, V]
    logits_t = jax.lax.dynamic_index_in_dim(logits, t, axis=1, keepdims=False)
    token = jnp.argmax(suppress_end(logits_t, t, out_len), axis=-1).astype(jnp.int32)
    token = jnp.where(t == out_len - 1, EOS_ID, token)
    return jax.lax.dynamic_update_slice(seqs, token[:, None], (0, t))

  return jax.lax.fori_loop(0, out_len, step, jnp.zeros((batch, out_len), jnp.int32))


def random_sources(
  rng: np.random.Generator, batch_size: int, src_len: int, vocab_size: int
) -> np.ndarray:
  """int32 [b, src_len]: ids in [2, vocab) and the EOS last (no padding)."""
  ids = rng.integers(2, vocab_size, size=(batch_size, src_len)).astype(np.int32)
  ids[:, -1] = EOS_ID
  return ids


def exact_length(tokens: np.ndarray) -> bool:
  """Whether every row is out_len tokens: no EOS or padding before the last, EOS last."""
  body = tokens[:, :-1]
  return bool(np.all(tokens[:, -1] == EOS_ID) and np.all((body != EOS_ID) & (body != PAD_ID)))


def _check_args(
  mc: ModelConfig,
  batch_size: int,
  src_len: int,
  out_len: int,
  beam_size: int,
  repeats: int,
  warmup: int,
) -> None:
  measure.check_at_least((
    ("--batch_size", batch_size, 1),
    ("--src_len", src_len, 1),
    ("--out_len", out_len, 1),
    ("--beam_size", beam_size, 2),
    ("--repeats", repeats, 1),
    ("--warmup", warmup, 0),
  ))
  if mc.kind == "transformer" and max(src_len, out_len) > mc.max_len:
    raise ConfigError(
      f"--src_len/--out_len ({src_len}/{out_len}) exceed model.max_len={mc.max_len} (the "
      "positional table): raise model.max_len or shorten them"
    )
  if mc.vocab_size < 3:
    raise ConfigError(f"model.vocab_size={mc.vocab_size}: must be >= 3 (0 and 1 are reserved)")


def run_benchmark(
  config: Any,
  batch_size: int = 8,
  src_len: int = 32,
  out_len: int = 64,
  beam_size: int = 4,
  repeats: int = 3,
  warmup: int = 1,
  log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
  """Compiles, warms up and times the three decoders; returns the JSON record.

  `config` is used as given (the command line's defaults are applied by `main`). Raises
  ConfigError for a config or shape the benchmark cannot run.
  """
  from transformer.validate import model_config

  log = log or (lambda message: None)
  mc = model_config(config)
  _check_args(mc, batch_size, src_len, out_len, beam_size, repeats, warmup)
  alpha = float(config.decode.alpha)
  seed = int(config.seed)

  host_rng = np.random.default_rng(seed)
  batches = [
    jnp.asarray(random_sources(host_rng, batch_size, src_len, mc.vocab_size))
    for _ in range(warmup + repeats)
  ]
  model = build_model(mc)
  params = jax.jit(model.init)(
    jax.random.key(seed), batches[0][:1], jnp.zeros((1, out_len), jnp.int32)
  )["params"]
  n_params = measure.count_params(params)

  fns = {
    "cached_greedy": lambda p, x: cached_decode(
      p, x, mc, beam_size=1, alpha=alpha, out_len=out_len
    ),
    "cached_beam": lambda p, x: cached_decode(
      p, x, mc, beam_size=beam_size, alpha=alpha, out_len=out_len
    ),
    "uncached_greedy": lambda p, x: uncached_greedy_decode(p, x, mc, out_len=out_len),
  }
  compiled, compile_s = {}, {}
  for mode in MODES:
    t = time.perf_counter()
    compiled[mode] = jax.jit(fns[mode]).lower(params, batches[0]).compile()
    compile_s[mode] = time.perf_counter() - t
    log(f"{mode}: compiled in {compile_s[mode]:.1f} s")

  times: dict[str, list[float]] = {mode: [] for mode in MODES}
  outputs: dict[str, list[np.ndarray]] = {mode: [] for mode in MODES}
  for i, inputs in enumerate(batches):
    for mode in MODES:  # interleaved: a load change on the machine hits every decoder
      t = time.perf_counter()
      tokens = jax.block_until_ready(compiled[mode](params, inputs))
      elapsed = time.perf_counter() - t
      outputs[mode].append(np.asarray(tokens))
      if i >= warmup:
        times[mode].append(elapsed)
    if i >= warmup:
      log(
        f"run {i - warmup + 1}/{repeats}: "
        + ", ".join(f"{mode} {times[mode][-1]:.3f} s" for mode in MODES)
      )

  greedy = np.stack(outputs["cached_greedy"])
  naive = np.stack(outputs["uncached_greedy"])
  record: dict[str, Any] = {
    "benchmark": "transformer decoding",
    "config": str(config.name),
    "batch_size": batch_size,
    "src_len": src_len,
    "out_len": out_len,
    "beam_size": beam_size,
    "alpha": alpha,
    "repeats": repeats,
    "warmup": warmup,
    "time_stat": "best",
  }
  for mode in MODES:
    best = min(times[mode])
    record.update(
      {
        f"{mode}_s": best,
        f"{mode}_s_median": statistics.median(times[mode]),
        f"{mode}_times_s": times[mode],
        f"{mode}_compile_s": compile_s[mode],
        f"{mode}_ms_per_step": 1e3 * best / out_len,
        f"{mode}_sentences_per_s": batch_size / best,
        f"{mode}_tokens_per_s": batch_size * out_len / best,
      }
    )
  record.update(
    {
      "speedup_cached_vs_uncached_greedy": record["uncached_greedy_s"] / record["cached_greedy_s"],
      "beam_cost_vs_cached_greedy": record["cached_beam_s"] / record["cached_greedy_s"],
      "same_tokens": bool(np.array_equal(greedy, naive)),
      "token_agreement": float(np.mean(greedy == naive)),
      "exact_length": all(exact_length(t) for mode in MODES for t in outputs[mode]),
      "greedy_tokens_first_row": greedy[0, 0].tolist(),
      "params": n_params,
      "kind": mc.kind,
      "d_model": mc.d_model,
      "layers": mc.num_layers,
      "heads": mc.num_heads,
      "head_dim": mc.head_dim,
      "d_ff": mc.d_ff,
      "vocab": mc.vocab_size,
      "dtype": str(mc.compute_dtype),
      "attention": mc.attention,
      "scan_layers": mc.scan_layers,
      "platform": jax.default_backend(),
      "device_kind": jax.devices()[0].device_kind,
      "device_count": jax.device_count(),
      "cpu": report.cpu_model(),
      "cpu_count": os.cpu_count(),
      "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
      "jax": jax.__version__,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
  )
  return record


def apply_defaults(config: Any, overridden: Callable[[str], bool]) -> list[str]:
  """The benchmark's defaults (module docstring) for fields not set on the command line.

  `overridden(field)` says whether `--config.<field>` was given. Returns what was changed.
  """
  changes = []
  with config.unlocked():
    # 'auto' already computes in float32 on CPU; an explicit bfloat16 is turned off there.
    if (not overridden("model.dtype") and jax.default_backend() == "cpu"
        and config.model.dtype not in ("float32", "auto")):
      changes.append(f"model.dtype {config.model.dtype} -> float32 (CPU)")
      config.model.dtype = "float32"
    if not overridden("model.vocab_size") and config.model.vocab_size == WMT_VOCAB_SIZE:
      changes.append(f"model.vocab_size {WMT_VOCAB_SIZE} -> {DEFAULT_VOCAB_SIZE}")
      config.model.vocab_size = DEFAULT_VOCAB_SIZE
  return changes


def _main() -> None:
  from absl import app, flags
  from ml_collections import config_flags

  config_flag = config_flags.DEFINE_config_file(
    "config",
    None,  # DEFAULT_CONFIG, set in `parse`: a default here would be loaded outside it
    "Config file and variant (default configs/wmt.py:base), e.g. configs/numbers.py.",
    lock_config=True,
  )
  batch_size = flags.DEFINE_integer("batch_size", 8, "Sentences per batch.")
  src_len = flags.DEFINE_integer("src_len", 32, "Source tokens per sentence (EOS included).")
  out_len = flags.DEFINE_integer("out_len", 64, "Output tokens per sentence (EOS included).")
  beam_size = flags.DEFINE_integer("beam_size", 4, "Beams of the cached beam search (>= 2).")
  repeats = flags.DEFINE_integer("repeats", 3, "Timed runs of each decoder (best is kept).")
  warmup = flags.DEFINE_integer("warmup", 1, "Untimed runs of each decoder after compiling.")
  FLAGS = flags.FLAGS

  def parse(argv: list[str]) -> list[str]:
    if not any(arg == "--config" or arg.startswith("--config=") for arg in argv[1:]):
      argv = [argv[0], f"--config={DEFAULT_CONFIG}", *argv[1:]]
    try:
      return FLAGS(argv)
    except flags.Error as e:
      fail(str(e).strip().splitlines()[0])
    except Exception as e:  # noqa: BLE001 - a config file that fails to load or parse
      fail(f"--config: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}")

  def overridden(field: str) -> bool:
    name = f"config.{field}"
    return name in FLAGS and FLAGS[name].present > 0

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(f"unexpected arguments {' '.join(argv[1:])!r}; use --config.field=value")
    config = config_flag.value
    try:
      changes = apply_defaults(config, overridden)
    except OSError as e:  # ml_collections reports a config file it could not load only here
      fail(f"--config: {str(e).strip().splitlines()[0]} ({FLAGS['config'].config_filename})")
    for change in changes:
      print(f"default: {change}", flush=True)
    try:
      record = run_benchmark(
        config,
        batch_size.value,
        src_len.value,
        out_len.value,
        beam_size.value,
        repeats.value,
        warmup.value,
        log=lambda message: print(message, flush=True),
      )
    except UserError as e:
      fail(str(e))
    for mode in MODES:
      print(
        f"{mode:16s} {record[f'{mode}_s']:8.3f} s  "
        f"{record[f'{mode}_sentences_per_s']:9.2f} sentences/s  "
        f"{record[f'{mode}_tokens_per_s']:10.1f} tokens/s",
        flush=True,
      )
    print(
      f"speed-up of cached over uncached greedy at out_len {record['out_len']}: "
      f"{record['speedup_cached_vs_uncached_greedy']:.2f}x; same tokens: "
      f"{record['same_tokens']}",
      flush=True,
    )
    print(json.dumps(record), flush=True)

  app.run(main, flags_parser=parse)


if __name__ == "__main__":
  _main()
