"""Decoding speed: our KV-cached greedy and beam search against an uncached decoder or CTranslate2.

    python -m benchmarks.decode --batch_size=8 --src_len=32 --out_len=64 \
        --beam_size=4 --repeats=3                # -> benchmarks/results/decode_cache.md
    python -m benchmarks.decode --peer=ctranslate2 --peer_batch_sizes=32,1 \
        --src_len=32 --out_len=64 --beam_size=4 --repeats=3   # -> decode_vs_ctranslate2.md

The first times KV-cached greedy and beam search against uncached greedy decoding, the second
against CTranslate2 float32 and int8 on the same (random) weights. Both print the table and,
last, one JSON object, and write their section (`--section`) of the report (`--out`) with the
command and the machine.

`run_benchmark` times decoders of random parameters on random source batches (ids in
[2, vocab), EOS last, no padding), every decoder producing exactly `out_len` tokens per
sentence, so that all run the same number of steps:

  - ours greedy / beam: `transformer.decoding.translate.decode_tokens` (encode once, then
    `greedy_decode` or `beam_search` over the model's KV cache, one token per step), with
    `suppress_end` as its logits filter: EOS and padding are -inf before the last step, and
    the decoders force the EOS there;
  - uncached greedy (without a peer): one jitted `lax.fori_loop` whose step t re-runs the whole
    decoder (`decode_logits`) on the fixed-length [b, out_len] input of the tokens so far and
    takes position t's logits; its tokens must equal ours greedy (`same_tokens`);
  - with `peer='ctranslate2'`: CTranslate2 float32 and int8 (quantized at load) greedy and beam
    search on the same weights, exported by `transformer.interop.export`, given each source's tokens
    without its EOS (the exported config appends it, as for any CTranslate2 user); the end
    token is forbidden before `out_len` tokens and decoding stops there. Its length penalty
    is length ** alpha, not the GNMT form: with every hypothesis of one length it changes no
    ranking.

Every round runs all decoders one after the other (`measure.time_interleaved`), so that a load
change on a shared machine hits them alike; times are the best of `repeats` rounds after
`warmup` (median kept too); tokens/s = batch * out_len / time, output tokens whatever the
number of beams, encoder included.

Defaults on top of the config (`apply_defaults`; each yields to an explicit
`--config.model.<field>`): float32 on CPU (bfloat16 matmuls are slow there), and the WMT
configs' 37000-token vocabulary replaced by 8192 (`DEFAULT_VOCAB_SIZE`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from measuring import measure, report, step_cost
from transformer.data.tokenizer import EOS_ID, PAD_ID
from transformer.decoding.translate import decode_tokens
from transformer.errors import ConfigError, UserError, fail, flags_parser
from transformer.nn.model import ModelConfig
from transformer.nn.model_family import build_model, count_params

Array = jax.Array

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "wmt.py") + ":base"
WMT_VOCAB_SIZE = 37000  # the paper's shared BPE vocabulary, as in configs/wmt.py
DEFAULT_VOCAB_SIZE = 8192  # what the benchmark uses instead, unless the command line sets it
PEERS = ("ctranslate2",)
SEARCHES = ("greedy", "beam")
# The parts of a decoding program, by the JAX source of its ops (`step_cost.op_profile`): the
# model's modules by their scopes (the output projection by the einsum of `Transformer.
# decode_logits` over the pre-transposed embedding); the search's own ops are the loop body's
# other ops. XLA leaves some ops without a source: copies it adds, and products it rewrites
# (at batch 1, most matrix-vector products).
DECODE_CATEGORIES = (
  ("encoder (once per batch)", ("Transformer.encode",)),
  ("output projection (tied embedding)", ("btd,dv->btv", "embed.attend", "/logits/")),
  ("decoder self-attention over the cache", ("self_attention",)),
  ("decoder cross-attention", ("cross_attention",)),
  ("feed-forward", ("feed_forward",)),
  ("layer norm", ("/norm/", "final_norm")),
  ("other model ops (embedding, residual adds)", ("Transformer.",)),
  ("search: log-softmax, top-k, hypotheses, cache reorder", ("while/body",)),
  ("setup and results outside the loop", ("jit(",)),
  ("ops without a source (XLA's copies, rewritten products)", ("",)),
)


def suppress_end(logits: Array, step: Array, out_len: int) -> Array:
  """Sets the EOS and padding logits to -inf before step out_len - 1.

  logits float [b, V]; step int scalar or [b] (broadcast over the vocabulary).
  """
  vocab = jnp.arange(logits.shape[-1])
  banned = (vocab == EOS_ID) | (vocab == PAD_ID)
  early = jnp.asarray(step)[..., None] < out_len - 1
  return jnp.where(early & banned, -jnp.inf, logits)


def cached_decode(
  params: Any, inputs: Array, mc: ModelConfig, *, beam_size: int, alpha: float, out_len: int
) -> Array:
  """`translate.decode_tokens` with outputs of exactly out_len tokens: int32 [b, out_len]."""
  return decode_tokens(params, inputs, mc, beam_size=beam_size, alpha=alpha,
                       max_extra_len=out_len, max_len=out_len,
                       logits_filter=lambda logits, step: suppress_end(logits, step, out_len))


def uncached_greedy_decode(
  params: Any, inputs: Array, mc: ModelConfig, *, out_len: int
) -> Array:
  """Greedy decoding that re-runs the decoder on the whole prefix at every step.

  inputs int32 [b, s] -> int32 [b, out_len], the same tokens as `cached_decode` with beam 1.
  Step t feeds the decoder [0, y_0, ..., y_{t-1}, 0, ...] and reads the logits at position t.
  """
  model = build_model(mc)
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

  return jax.lax.fori_loop(0, out_len, step, jnp.zeros((inputs.shape[0], out_len), jnp.int32))


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


def ct2_translators(model_dir: str, threads: int) -> dict[str, Any]:
  """CTranslate2 translators of one exported float32 model: float32 and int8 (quantized at
  load), each on `threads` threads, one batch at a time."""
  import ctranslate2

  return {f"ct2_{compute_type}": ctranslate2.Translator(
    model_dir, device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=threads)
    for compute_type in ("float32", "int8")}


def ct2_decode(translator: Any, sources: list[list[str]], *, beam_size: int, alpha: float,
               out_len: int) -> list[list[str]]:
  """CTranslate2's best hypothesis of each source (its tokens without the EOS, which the
  exported config appends), exactly `out_len` tokens long."""
  results = translator.translate_batch(
    sources, beam_size=beam_size, length_penalty=alpha if beam_size > 1 else 0.0,
    min_decoding_length=out_len, max_decoding_length=out_len, max_batch_size=0,
  )
  return [r.hypotheses[0] for r in results]


def check_args(mc: ModelConfig, batch_sizes: tuple[int, ...], src_len: int, out_len: int,
               beam_size: int, repeats: int, warmup: int, peer: str | None = None) -> None:
  """ConfigError for a shape the benchmark cannot run, before anything is built."""
  measure.check_at_least((
    ("--peer_batch_sizes" if peer else "--batch_size", min(batch_sizes, default=0), 1),
    ("--src_len", src_len, 1), ("--out_len", out_len, 1), ("--beam_size", beam_size, 2),
    ("--repeats", repeats, 1), ("--warmup", warmup, 0),
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
  batch_sizes: tuple[int, ...] = (8,),
  src_len: int = 32,
  out_len: int = 64,
  beam_size: int = 4,
  repeats: int = 3,
  warmup: int = 1,
  peer: str | None = None,
  threads: int | None = None,
  log: Callable[[str], None] = lambda message: None,
  profile: bool = False,
) -> dict[str, Any]:
  """Compiles and times the decoders (module docstring) at each batch size: the JSON record.

  `config` is used as given (the command line's defaults are applied by `main`); CTranslate2
  runs on `threads` threads (default: all cores, as XLA's CPU runtime uses). With `profile`,
  our greedy and beam search then run once more each under the JAX profiler, untimed:
  `profiles` holds their `step_cost.op_profile` per output token (`DECODE_CATEGORIES`). Raises
  ConfigError for a config or shape the benchmark cannot run.
  """
  from transformer.interop import export
  from transformer.training.validate import model_config

  mc = model_config(config)
  check_args(mc, batch_sizes, src_len, out_len, beam_size, repeats, warmup, peer)
  if peer:
    export.check_exportable(mc)
  alpha, seed = float(config.decode.alpha), int(config.seed)
  model = build_model(mc)
  params = jax.jit(model.init)(
    jax.random.key(seed), jnp.ones((1, src_len), jnp.int32), jnp.zeros((1, out_len), jnp.int32)
  )["params"]
  record: dict[str, Any] = {
    "benchmark": "transformer decoding", "config": str(config.name), "peer": peer,
    "batch_sizes": list(batch_sizes), "src_len": src_len, "out_len": out_len,
    "beam_size": beam_size, "alpha": alpha, "repeats": repeats, "warmup": warmup,
    "time_stat": "best", "params": count_params(params), "d_model": mc.d_model,
    "layers": mc.num_layers, "heads": mc.num_heads, "d_ff": mc.d_ff, "vocab": mc.vocab_size,
    "dtype": str(mc.compute_dtype), "hardware": report.hardware(), "results": [], "checks": [],
    "profiles": [],
  }
  host_rng = np.random.default_rng(seed)
  with contextlib.ExitStack() as stack:
    translators, vocab = {}, []
    if peer:
      import tempfile

      tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ct2-"))
      vocab = export.synthetic_vocabulary(mc.vocab_size)
      # One line (UserError) where ctranslate2 is not installed.
      model_dir = export.export_ctranslate2(params, mc, os.path.join(tmp, "model"),
                                            vocabulary=vocab)
      import ctranslate2

      threads = threads or os.cpu_count() or 1
      translators = ct2_translators(model_dir, threads)
      record.update(ctranslate2=ctranslate2.__version__, ct2_threads=threads,
                    ct2_force_cpu_isa=os.environ.get("CT2_FORCE_CPU_ISA") or None)
    for b in batch_sizes:
      batches = [random_sources(host_rng, b, src_len, mc.vocab_size)
                 for _ in range(warmup + repeats)]
      results, check, ours = time_decoders(params, mc, batches, translators, vocab, beam_size,
                                           alpha, out_len, warmup, log)
      record["results"] += results
      record["checks"].append(check)
      if profile:
        record["profiles"] += profile_decoders(params, ours, batches[0], out_len)
  return record


def profile_decoders(params: Any, programs: dict[str, Any], batch: np.ndarray,
                     out_len: int) -> list[dict[str, Any]]:
  """Our compiled searches (`time_decoders`' {search: program}, already run) on `batch`, each
  once more under the JAX profiler: where each one's time goes per output token
  (`step_cost.op_profile` with `DECODE_CATEGORIES`, op seconds summed over threads)."""
  import tempfile

  profiles = []
  for search, compiled in programs.items():
    with tempfile.TemporaryDirectory(prefix="decode-profile-") as trace_dir:
      with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        jax.block_until_ready(compiled(params, jnp.asarray(batch)))
      op_seconds = measure.trace_op_seconds(trace_dir)
    profiles.append({"batch_size": len(batch), "search": search,
                     **step_cost.op_profile(op_seconds, compiled.as_text(), out_len, top=6,
                                            categories=DECODE_CATEGORIES)})
  return profiles


def profile_tables(record: dict[str, Any]) -> list[str]:
  """Markdown: per batch size and search, the op time per output token by part and the
  costliest ops (empty without profiles)."""
  out = []
  for p in record.get("profiles", []):
    beams = f" {record['beam_size']}" if p["search"] == "beam" else ""
    out.append(f"### Where our {p['search']}{beams} time goes: batch {p['batch_size']}\n")
    out.append(f"Op time per output token {1e3 * p['op_seconds_per_step']:.2f} ms (summed over "
               "threads, one profiled run).\n")
    out.append(report.markdown_table(
      ["part", "ms per token", "share"],
      [[c["category"], f"{1e3 * c['seconds']:.3f}", f"{c['share']:.1%}"]
       for c in p["categories"]]))
    out.append(report.markdown_table(
      ["costliest ops", "shape", "ms per token", "share", "source"],
      [[f"`{o['op']}`", f"`{o['shape']}`", f"{1e3 * o['seconds']:.3f}", f"{o['share']:.1%}",
        f"`{short_source(o['source'])}`"] for o in p["top_ops"]], align="llrrl"))
  return out


def short_source(op_name: str, width: int = 80) -> str:
  """An op's JAX source without the program, loop and model prefixes, at most `width` long."""
  name = op_name.split("/while/body/")[-1].replace("Transformer.decode_logits/", "")
  return name if len(name) <= width else "..." + name[-(width - 3):]


def time_decoders(params: Any, mc: ModelConfig, batches: list[np.ndarray],
                  translators: dict[str, Any], vocab: list[str], beam_size: int, alpha: float,
                  out_len: int, warmup: int, log: Callable[[str], None]
                  ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
  """Every decoder on `batches` (one per round, the first `warmup` untimed): a result row per
  (decoder, search), the batch size's checks (exact lengths, ours = uncached greedy) and our
  compiled programs by search."""
  b = len(batches[0])
  decoders, compile_s, ours = {}, {}, {}
  for search in SEARCHES:
    k = beam_size if search == "beam" else 1
    fns = {("ours", search): functools.partial(cached_decode, mc=mc, beam_size=k, alpha=alpha,
                                                out_len=out_len)}
    if search == "greedy" and not translators:
      fns["uncached", search] = functools.partial(uncached_greedy_decode, mc=mc,
                                                  out_len=out_len)
    for name, fn in fns.items():
      compiled, lower_s, xla_s = measure.compile_timed(
        lambda fn=fn: jax.jit(fn).lower(params, jnp.asarray(batches[0])))
      compile_s[name] = lower_s + xla_s
      if name[0] == "ours":
        ours[search] = compiled
      decoders[name] = lambda i, c=compiled: np.asarray(c(params, jnp.asarray(batches[i])))
      log(f"batch {b} {name[0]} {search}: compiled in {compile_s[name]:.1f} s")
    for impl, translator in translators.items():
      # The rows end in EOS; CTranslate2 gets the tokens before it, as its users pass them.
      decoders[impl, search] = lambda i, t=translator, k=k: ct2_decode(
        t, [[vocab[j] for j in row[:-1]] for row in batches[i]], beam_size=k, alpha=alpha,
        out_len=out_len)
  times, outputs = measure.time_interleaved(decoders, len(batches), warmup, log=log)
  results = []
  for (impl, search), ts in times.items():
    best = min(ts)
    results.append({
      "batch_size": b, "decoder": impl, "search": search,
      "beams": beam_size if search == "beam" else 1, "s": best,
      "s_median": statistics.median(ts), "times_s": ts,
      "compile_s": compile_s.get((impl, search)), "ms_per_step": 1e3 * best / out_len,
      "sentences_per_s": b / best, "tokens_per_s": b * out_len / best})
  exact = all(exact_length(t) if isinstance(t, np.ndarray) else
              all(len(h) == out_len for h in t) for ts in outputs.values() for t in ts)
  check = {"batch_size": b, "exact_length": exact}
  if ("uncached", "greedy") in outputs:
    greedy, naive = (np.stack(outputs[k, "greedy"]) for k in ("ours", "uncached"))
    check.update(same_tokens=bool(np.array_equal(greedy, naive)),
                 token_agreement=float(np.mean(greedy == naive)),
                 greedy_tokens_first_row=greedy[0, 0].tolist())
  return results, check, ours


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


def results_table(record: dict[str, Any]) -> str:
  """Markdown: a row per batch size and search, tokens/s of every decoder, ours / each other."""
  by = {(r["batch_size"], r["search"], r["decoder"]): r for r in record["results"]}
  impls = list(dict.fromkeys(r["decoder"] for r in record["results"]))
  others = impls[1:]
  rows = []
  for b, search in dict.fromkeys((r["batch_size"], r["search"]) for r in record["results"]):
    ours = by[b, search, "ours"]
    cells = [by.get((b, search, i)) for i in impls]
    rows.append([b, search + (f" {ours['beams']}" if search == "beam" else ""),
                 *(report.fmt(c and c["tokens_per_s"], 1) for c in cells),
                 f"{ours['ms_per_step']:.2f}",
                 *(report.fmt(c and f"{ours['tokens_per_s'] / c['tokens_per_s']:.2f}x")
                   for c in cells[1:])])
  label = {"ours": "ours", "uncached": "uncached", "ct2_float32": "ct2 fp32",
           "ct2_int8": "ct2 int8"}
  return report.markdown_table(
    ["batch", "search", *(f"{label[i]} tok/s" for i in impls), "ours ms/step",
     *(f"ours / {label[i]}" for i in others)], rows, align="rl" + "r" * (len(impls) * 2))


def isa_note(record: dict[str, Any]) -> str:
  """A `## Machine` bullet when the decoders' kernels were limited to a narrower ISA than the
  CPU has (`--xla_cpu_max_isa` in XLA_FLAGS, CTranslate2's `CT2_FORCE_CPU_ISA`), else ''."""
  hw = record["hardware"]
  isas = {f"XLA (`{w}`)": w.split("=", 1)[1] for w in hw.get("xla_flags", "").split()
          if w.startswith("--xla_cpu_max_isa=")}
  if record.get("ct2_force_cpu_isa"):
    isas[f"CTranslate2 (`CT2_FORCE_CPU_ISA={record['ct2_force_cpu_isa']}`)"] = (
      record["ct2_force_cpu_isa"])
  if not isas:
    return ""
  limits = " and ".join(f"{who} to {isa}" for who, isa in isas.items())
  isa = " / ".join(dict.fromkeys(isas.values()))
  kind = hw.get("cpu_kind", "unknown").split(" (")[0]
  return (f"- Kernels limited: {limits}. This measures the {isa} kernels on this {kind} "
          f"machine, not an {isa} machine: the cores, caches and memory are this one's.\n")


def report_parts(record: dict[str, Any]) -> dict[str, Any]:
  """`report.write`'s title, intro, body, record and machine note (`isa_note`) of a
  `run_benchmark` record."""
  r = record
  compared = (f"CTranslate2 {r['ctranslate2']} (float32, and int8 with weights quantized at "
              f"load, on {r['ct2_threads']} thread(s)) on the same weights, exported with "
              "`transformer.interop.export`" if r["peer"] else
              "the uncached greedy decoder, which re-runs the whole decoder at every step")
  setting = (
    f"Random parameters of `{r['config']}` ({r['layers']} + {r['layers']} layers, d_model "
    f"{r['d_model']}, d_ff {r['d_ff']}, {r['heads']} heads, vocabulary {r['vocab']}, "
    f"{r['params']:,} parameters, {r['dtype']}); our KV-cached greedy and beam search "
    f"({r['beam_size']} beams, alpha {r['alpha']}) against {compared}. Every decoder turns "
    f"random sources of {r['src_len']} tokens into exactly {r['out_len']} tokens (EOS "
    "suppressed until the last step), so all run the same number of steps. Best of "
    f"{r['repeats']} rounds after {r['warmup']} warm-up round(s), every round running all "
    "decoders one after the other; tokens/s = batch * out_len / time, encoder included. "
    "Ratios above 1 mean ours is faster.\n")
  checks = [f"batch {c['batch_size']}: every output exactly {r['out_len']} tokens: "
            f"{c['exact_length']}" + (f"; ours and uncached greedy gave the same tokens: "
                                      f"{c['same_tokens']}" if "same_tokens" in c else "")
            for c in r["checks"]]
  body = [setting, "## Results\n", results_table(r), "\n" + ".\n".join(checks) + ".\n",
          *profile_tables(r)]
  title = ("Decoding speed against CTranslate2, same weights" if r["peer"] else
           "Decoding speed: KV-cached against uncached decoding")
  intro = ("Produced by `benchmarks/decode.py` (method in its docstring), a section per "
           "machine or kernel choice (`--section`).")
  return {"title": title, "intro": intro, "body": body, "record": r,
          "machine_note": isa_note(r)}


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags

  _CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,  # DEFAULT_CONFIG, set in `parse`: a default here would be loaded outside it
    "Config file and variant (default configs/wmt.py:base), e.g. configs/numbers.py.",
    lock_config=True,
  )
  _BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Sentences per batch.")
  _SRC_LEN = flags.DEFINE_integer("src_len", 32, "Source tokens per sentence (EOS included).")
  _OUT_LEN = flags.DEFINE_integer("out_len", 64, "Output tokens per sentence (EOS included).")
  _BEAM_SIZE = flags.DEFINE_integer("beam_size", 4, "Beams of the beam search (>= 2).")
  _REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds (best is kept).")
  _WARMUP = flags.DEFINE_integer("warmup", 1, "Untimed rounds after compiling.")
  _PEER = flags.DEFINE_enum("peer", None, list(PEERS),
                            "Compare against this library on the same weights instead.")
  _PEER_BATCH_SIZES = flags.DEFINE_list("peer_batch_sizes", ["32", "1"],
                                        "--peer: the batch sizes to time.")
  _THREADS = flags.DEFINE_integer("threads", None, "--peer: CTranslate2 threads (default: all "
                                  "cores, as XLA's CPU runtime uses).")
  _PROFILE = flags.DEFINE_bool("profile", True, "Profile our greedy and beam search once more "
                               "each (untimed): where their time goes, in the report.")
  _OUT = flags.DEFINE_string(
    "out", None, "The report's path without extension ('' for none); default "
    "benchmarks/results/decode_cache, with --peer decode_vs_ctranslate2.")
  _SECTION = flags.DEFINE_string("section", "default", "The report's section this run writes "
                                 "(the others are kept), e.g. avx2.")
  FLAGS = flags.FLAGS

  def overridden(field: str) -> bool:
    name = f"config.{field}"
    return name in FLAGS and FLAGS[name].present > 0

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(f"unexpected arguments {' '.join(argv[1:])!r}; use --config.field=value")
    config = _CONFIG.value
    try:
      changes = apply_defaults(config, overridden)
    except OSError as e:  # ml_collections reports a config file it could not load only here
      fail(f"--config: {str(e).strip().splitlines()[0]} ({FLAGS['config'].config_filename})")
    for change in changes:
      print(f"default: {change}", flush=True)
    batch_sizes = (_BATCH_SIZE.value,)
    if _PEER.value:
      try:
        batch_sizes = tuple(int(b) for b in _PEER_BATCH_SIZES.value)
      except ValueError:
        fail(f"--peer_batch_sizes={','.join(_PEER_BATCH_SIZES.value)}: integers expected")
    command = report.public_command(report.command_line())
    try:
      record = run_benchmark(
        config, batch_sizes, _SRC_LEN.value, _OUT_LEN.value, _BEAM_SIZE.value, _REPEATS.value,
        _WARMUP.value, _PEER.value, _THREADS.value, log=lambda message: print(message, flush=True),
        profile=_PROFILE.value)
    except UserError as e:
      fail(str(e))
    print(results_table(record), flush=True)
    path = _OUT.value
    if path is None:
      name = "decode_vs_ctranslate2" if _PEER.value else "decode_cache"
      path = os.path.join(ROOT, "benchmarks", "results", name)
    if path:
      md, _ = report.write(path, command=command, section=_SECTION.value,
                           **report_parts(record))
      print(f"report: {md}", flush=True)
    print(json.dumps(record), flush=True)

  app.run(main, flags_parser=flags_parser(config=DEFAULT_CONFIG))
