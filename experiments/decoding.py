"""Decoding-speed measurements (no flags; the command is experiments/decode_benchmark.py).

Two benchmarks share the helpers here:

`run_benchmark`: KV-cached greedy and beam search against uncached greedy decoding. With random
parameters and random source batches (ids in [2, vocab), EOS = 1 last, no padding) it compiles,
warms up and then times three decoders, each producing exactly `out_len` tokens per sentence:

  - cached_greedy: the path of `transformer.translate.decode_tokens` with beam 1 (encode once,
    then `transformer.decode.greedy_decode` over the model's KV cache, one token per step);
  - cached_beam: the same path with `beam_search` and `beam_size` beams;
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

`run_peer_benchmark`: the cached decoders against CTranslate2 on the same weights (exported
with `transformer.export`), float32 and int8, greedy and beam search, at several batch sizes;
see its docstring.

Times are the BEST of `repeats` timed runs (median also reported), each run synchronised
before its clock stops; the decoders are interleaved run by run, so that a load change on a
shared machine hits them alike. sentences/s = batch / time; tokens/s = batch * out_len / time
(output tokens, whatever the number of beams).

Defaults on top of the config (`apply_defaults`; each one yields to an explicit
`--config.model.<field>`): the compute dtype is float32 on CPU (bfloat16 matmuls are slow
there), and the WMT configs' 37000-token vocabulary is replaced by 8192 (`DEFAULT_VOCAB_SIZE`).
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments import measure, report
from transformer.data.tokenizer import EOS_ID, PAD_ID
from transformer.errors import ConfigError
from transformer.model import ModelConfig
from transformer.model_family import build_model
from transformer.translate import decode_tokens

Array = jax.Array

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "wmt.py") + ":base"
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
  returned); `suppress_end` is its logits filter.
  """
  return decode_tokens(params, inputs, mc, beam_size=beam_size, alpha=alpha,
                       max_extra_len=out_len, max_len=out_len,
                       logits_filter=lambda logits, step: suppress_end(logits, step, out_len))


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


# ----------------------------------------------------------------------------- CTranslate2

PEERS = ("ctranslate2",)
# The decoders of the peer benchmark, in the order they run within a timed round.
PEER_DECODERS = ("ours", "ct2_float32", "ct2_int8")
SEARCHES = ("greedy", "beam")


def ct2_translators(model_dir: str, threads: int) -> dict[str, Any]:
  """CTranslate2 translators of one exported float32 model: float32 and int8 (quantized at
  load), each on `threads` threads, one batch at a time."""
  import ctranslate2

  return {
    f"ct2_{compute_type}": ctranslate2.Translator(
      model_dir, device="cpu", compute_type=compute_type, inter_threads=1,
      intra_threads=threads,
    )
    for compute_type in ("float32", "int8")
  }


def ct2_decode(translator: Any, sources: list[list[str]], *, beam_size: int, alpha: float,
               out_len: int) -> list[list[str]]:
  """CTranslate2's best hypothesis of each source, exactly `out_len` tokens long.

  The end token is forbidden before `out_len` tokens (`min_decoding_length`) and decoding
  stops at `out_len` (`max_decoding_length`): out_len decoder steps, as the project's decoders
  run under `suppress_end`. CTranslate2's length penalty is length ** alpha, not the GNMT
  form: with every hypothesis of one length it changes no ranking, and costs the same.
  """
  results = translator.translate_batch(
    sources, beam_size=beam_size, length_penalty=alpha if beam_size > 1 else 0.0,
    min_decoding_length=out_len, max_decoding_length=out_len, max_batch_size=0,
  )
  return [r.hypotheses[0] for r in results]


def run_peer_benchmark(
  config: Any,
  batch_sizes: tuple[int, ...] = (32, 1),
  src_len: int = 32,
  out_len: int = 64,
  beam_size: int = 4,
  repeats: int = 3,
  warmup: int = 1,
  threads: int | None = None,
  log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
  """The project's cached decoders against CTranslate2 float32 and int8 on the same weights.

  Random parameters of `config` are exported with `transformer.export` (a temporary
  directory); for every batch size, greedy and beam search (`beam_size`, alpha =
  config.decode.alpha) run on the same random sources, exactly `out_len` tokens each. Every
  round times ours, CTranslate2 float32 and CTranslate2 int8 one after the other (alternated,
  so load changes hit all three); `warmup` untimed rounds follow compilation. CTranslate2 runs
  on `threads` threads (default: all cores, as XLA's CPU runtime uses).

  Returns the JSON record: per batch size and search, tokens/s of each decoder and the
  ratios ours / CTranslate2. Raises ConfigError for shapes the benchmark cannot run.
  """
  import tempfile

  from transformer import export
  from transformer.validate import model_config

  log = log or (lambda message: None)
  mc = model_config(config)
  measure.check_at_least((("--peer_batch_sizes", min(batch_sizes, default=0), 1),))
  for b in batch_sizes:
    _check_args(mc, b, src_len, out_len, beam_size, repeats, warmup)
  export.check_exportable(mc)
  alpha = float(config.decode.alpha)
  seed = int(config.seed)
  threads = threads or os.cpu_count() or 1
  vocab = export.synthetic_vocabulary(mc.vocab_size)

  host_rng = np.random.default_rng(seed)
  model = build_model(mc)
  params = jax.jit(model.init)(
    jax.random.key(seed), jnp.ones((1, src_len), jnp.int32), jnp.zeros((1, out_len), jnp.int32)
  )["params"]
  record: dict[str, Any] = {
    "benchmark": "transformer decoding vs ctranslate2",
    "config": str(config.name), "batch_sizes": list(batch_sizes), "src_len": src_len,
    "out_len": out_len, "beam_size": beam_size, "alpha": alpha, "repeats": repeats,
    "warmup": warmup, "time_stat": "best", "ct2_threads": threads,
    "params": measure.count_params(params), "d_model": mc.d_model, "layers": mc.num_layers,
    "heads": mc.num_heads, "d_ff": mc.d_ff, "vocab": mc.vocab_size,
    "dtype": str(mc.compute_dtype), "platform": jax.default_backend(),
    "cpu": report.cpu_model(), "cpu_count": os.cpu_count(), "jax": jax.__version__,
    "xla_flags": os.environ.get("XLA_FLAGS", ""), "results": [],
  }
  with tempfile.TemporaryDirectory(prefix="ct2-") as tmp:
    model_dir = export.export_ctranslate2(params, mc, os.path.join(tmp, "model"),
                                          vocabulary=vocab)
    translators = ct2_translators(model_dir, threads)
    import ctranslate2

    record["ctranslate2"] = ctranslate2.__version__
    for b in batch_sizes:
      batches = [random_sources(host_rng, b, src_len, mc.vocab_size)
                 for _ in range(warmup + repeats)]
      tokens = [[[vocab[i] for i in row] for row in batch] for batch in batches]
      ours = {}
      for search in SEARCHES:
        k = beam_size if search == "beam" else 1
        fn = functools.partial(cached_decode, mc=mc, beam_size=k, alpha=alpha, out_len=out_len)
        t = time.perf_counter()
        ours[search] = jax.jit(fn).lower(params, jnp.asarray(batches[0])).compile()
        log(f"batch {b} {search}: compiled in {time.perf_counter() - t:.1f} s")
      times = {(s, d): [] for s in SEARCHES for d in PEER_DECODERS}
      exact = True
      for i in range(warmup + repeats):
        inputs = jnp.asarray(batches[i])
        for search in SEARCHES:
          k = beam_size if search == "beam" else 1
          for decoder in PEER_DECODERS:
            t = time.perf_counter()
            if decoder == "ours":
              out = np.asarray(jax.block_until_ready(ours[search](params, inputs)))
              exact &= exact_length(out)
            else:
              hyps = ct2_decode(translators[decoder], tokens[i], beam_size=k, alpha=alpha,
                                out_len=out_len)
              exact &= all(len(h) == out_len for h in hyps)
            elapsed = time.perf_counter() - t
            if i >= warmup:
              times[search, decoder].append(elapsed)
        if i >= warmup:
          log(f"batch {b} round {i - warmup + 1}/{repeats}: " + ", ".join(
            f"{s} {d} {times[s, d][-1]:.3f} s" for s in SEARCHES for d in PEER_DECODERS))
      for search in SEARCHES:
        row: dict[str, Any] = {"batch_size": b, "search": search,
                               "beams": beam_size if search == "beam" else 1}
        for decoder in PEER_DECODERS:
          best = min(times[search, decoder])
          row[f"{decoder}_s"] = best
          row[f"{decoder}_s_median"] = statistics.median(times[search, decoder])
          row[f"{decoder}_tokens_per_s"] = b * out_len / best
        for peer in PEER_DECODERS[1:]:
          row[f"ours_vs_{peer}"] = row["ours_tokens_per_s"] / row[f"{peer}_tokens_per_s"]
        record["results"].append(row)
      record[f"exact_length_batch_{b}"] = bool(exact)
  record["load_avg_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
  return record


def peer_table(record: dict[str, Any]) -> str:
  """The markdown table of a `run_peer_benchmark` record: tokens/s and ratios per row."""
  rows = []
  for r in record["results"]:
    rows.append([
      r["batch_size"], r["search"] + (f" {r['beams']}" if r["search"] == "beam" else ""),
      report.fmt(r["ours_tokens_per_s"], 1), report.fmt(r["ct2_float32_tokens_per_s"], 1),
      report.fmt(r["ct2_int8_tokens_per_s"], 1), f"{r['ours_vs_ct2_float32']:.2f}x",
      f"{r['ours_vs_ct2_int8']:.2f}x",
    ])
  return report.markdown_table(
    ["batch", "search", "ours tok/s", "ct2 fp32 tok/s", "ct2 int8 tok/s", "ours / ct2 fp32",
     "ours / ct2 int8"], rows, align="rlrrrrr")


def write_peer_report(path: str, record: dict[str, Any], command: str) -> str:
  """experiments/results/decode_vs_ctranslate2.md from a `run_peer_benchmark` record."""
  intro = (
    "Produced by `experiments/decode_benchmark.py --peer=ctranslate2` (method in "
    "`experiments/decoding.py`, `run_peer_benchmark`). Random parameters of the config "
    f"(`{record['config']}`: {record['layers']} + {record['layers']} layers, d_model "
    f"{record['d_model']}, d_ff {record['d_ff']}, {record['heads']} heads, vocabulary "
    f"{record['vocab']}, {record['params']:,} parameters) are exported to CTranslate2 "
    f"{record.get('ctranslate2', '')} with `transformer.export`; both libraries decode the "
    f"same random sources of {record['src_len']} tokens into exactly {record['out_len']} "
    "tokens per sentence (EOS suppressed until the last step on both sides), so every decoder "
    f"runs {record['out_len']} steps. Beam search: {record['beam_size']} beams, alpha "
    f"{record['alpha']} (GNMT penalty here, length ** alpha in CTranslate2: the same cost). "
    f"Ours computes in {record['dtype']} under XLA's CPU runtime; CTranslate2 runs float32 and "
    f"int8 (weights quantized at load) on {record['ct2_threads']} thread(s). Times are the "
    f"best of {record['repeats']} rounds (after {record['warmup']} warm-up round), each round "
    "running ours, CTranslate2 float32 and CTranslate2 int8 one after the other; tokens/s = "
    "batch * out_len / time, encoder included. Ratios above 1 mean the project is faster."
  )
  exact = all(v for k, v in record.items() if k.startswith("exact_length_batch_"))
  body = ["## Results\n", peer_table(record),
          f"\nEvery output was exactly {record['out_len']} tokens: {exact}.\n"]
  return report.write_markdown(path, "Decoding speed against CTranslate2, same weights", intro,
                               command, body)
