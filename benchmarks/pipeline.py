"""The data path at full size: a first start and a restart, stage by stage, time and memory.

    python -m benchmarks.synthetic_wmt --data_dir=/tmp/synth_wmt        # once: 4.5M pairs
    python -m benchmarks.pipeline --config=configs/wmt.py \\
        --config.data_dir=/tmp/synth_wmt --workdir=/tmp/pipeline_bench

Runs the start-up of `train_and_evaluate` twice, each in a fresh process: a first start on an
empty workdir (vocabulary training, tokenizing into the token cache) and a restart on the same
workdir (vocabulary and cache present). Each start goes through the library's own stages:

  open          `input_pipeline.open_reader` (data check; builds the numbers corpus if absent)
  vocabulary    `get_tokenizer` (the sample streamed by index, SentencePiece training)
  token cache   `token_cache.load_or_build` (stream, tokenize, write; or memory-map)
  batch plan    the bucket lengths, `train_batches` (bucketed or packed), its first epoch, the
                evaluation splits
  first step    the sharded init, the ahead-of-time compile of every training and evaluation
                batch shape (`Trainer.precompile`, as training does), and one training step

and reports the wall time and the peak resident memory (RSS, sampled every 50 ms) of each, then
the host's batch rate (batches built ahead by the training loop's thread: gather, pad, transfer)
against the rate an accelerator would consume, and the fraction of real tokens in the batches.
The model is tiny by default (`--tiny_model`), so that the data path dominates.

JAX's persistent compilation cache (transformer/compilation.py) is measured too: the first
start fills a cache directory; the restart runs with an empty one (as without the cache), and a
third start, the same restart with the first start's cache, loads the compiled programs instead
of compiling them. The report compares the two restarts' compile time and time to the first
step (`--config=configs/numbers.py --notiny_model` measures it on a model that takes seconds to
compile).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from measuring import measure, report
from transformer import hardware
from transformer.errors import fail, flags_parser

# Peak dense bfloat16 throughput (transformer/hardware.py), for the rate an accelerator
# consumes: Colab's TPU v2-8 (4 chips, 8 cores) and an H100 SXM. MFU 0.4 is a typical
# well-tuned Transformer step.
ACCELERATORS = {"TPU v2-8 (Colab)": 4 * hardware.PEAK_BF16["TPU v2"],
                "H100 SXM": hardware.PEAK_BF16["H100"]}
MFU = 0.4
DATA_STAGES = ("open", "vocabulary", "token cache", "batch plan")
# The third start: the restart again, with the compilation cache the first start filled.
WARM = "restart, warm compilation cache"


def one_start(config: Any, workdir: str, batches: int, compile_threads: int = 0) -> dict[str, Any]:
  """The start-up stages of a training run in this process; times, peaks and rates.
  `compile_threads`: threads compiling the batch shapes' programs (0: as training does)."""
  import jax
  import numpy as np

  from transformer import compilation, storage
  from transformer import sharding as sharding_lib
  from transformer.data import bucketing, input_pipeline, token_cache, vocabulary
  from transformer.data.prefetch import Prefetcher
  from transformer.training.trainer import Trainer, eval_shapes, shape_key
  from transformer.training.validate import validate

  rss = measure.PeakRSS()
  stages: list[dict[str, Any]] = []
  t = time.time()

  def stage(name: str) -> None:
    nonlocal t
    now = time.time()
    stages.append({"stage": name, "seconds": now - t, "peak_rss_bytes": rss.take()})
    t = now

  start = time.time()
  model_config = validate(config, jax.device_count())
  compilation.use_persistent_cache(config.compilation_cache_dir)
  reader = input_pipeline.open_reader(config)
  storage.check_writable(workdir)
  stage("open")
  tok = vocabulary.get_tokenizer(config, workdir, reader)
  stage("vocabulary")
  split = token_cache.load_or_build(reader, "train", tok, token_cache.cache_root(config, workdir))
  stage("token cache")
  cache_dir = split.directory  # its memory-mapped files and meta.json
  cache_bytes = sum(os.path.getsize(os.path.join(cache_dir, f)) for f in os.listdir(cache_dir)
                    if os.path.isfile(os.path.join(cache_dir, f)))
  mesh = sharding_lib.make_mesh(config.mesh)
  # As `input_pipeline.build_pipeline` does.
  buckets = bucketing.resolve_buckets(config, split)
  train = input_pipeline.train_batches(split, config, buckets=buckets,
                                       batch_multiple=sharding_lib.data_parallel_size(mesh))
  train.batch(0)  # draws the first epoch's plan
  evals, _ = input_pipeline.evaluation_data(config, reader, tok,
                                            sharding_lib.data_parallel_size(mesh),
                                            buckets=buckets)
  stage("batch plan")
  trainer = Trainer(config, mesh, model_config)
  state = trainer.init_state(config.seed)
  t_compile = time.time()
  with compilation.CompileCounter() as compiles:
    compiled = trainer.precompile(train.shapes(), eval_shapes(evals["validation"] + evals["test"]),
                                  compile_threads or None)
  compile_seconds = time.time() - t_compile
  batch = sharding_lib.local_batch_to_global(train.batch(0), mesh)
  state, metrics = trainer.train_step(state, batch, jax.random.key(0))
  jax.block_until_ready(metrics)
  stage("first step")
  to_first_step = time.time() - start

  # The host's batch rate: the training loop's own prefetch thread, consumer waiting only.
  # The first `warmup` batches (first transfers of each shape) are not timed.
  warmup = min(100, batches // 4)
  ahead = Prefetcher(lambda i: sharding_lib.local_batch_to_global(train.batch(i), mesh),
                     1, 1 + warmup + batches)
  for _ in range(warmup):
    ahead.next()
  t0 = time.time()
  positions = 0
  for _ in range(batches):
    b = ahead.next()
    positions += int(np.prod(b["inputs"].shape))
  rate = batches / (time.time() - t0)
  ahead.close()
  stage("batches")
  rss.close()
  # What the step itself holds: on a CPU its buffers are host memory, on an accelerator they
  # are device memory. XLA's own accounting for the first batch's shape.
  mem = compiled[shape_key(batch)].memory_analysis()
  step_bytes = sum(int(getattr(mem, f, 0) or 0) for f in (
    "temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes"))
  return {
    "step_xla_bytes": step_bytes, "first_batch_shape": list(batch["inputs"].shape),
    "stages": stages, "to_first_step_seconds": to_first_step,
    # Within the first step: the ahead-of-time compile, its programs and cache loads.
    "compile_seconds": compile_seconds, "programs_compiled": compiles.compiles,
    "programs_from_cache": compiles.cache_hits,
    "compile_threads": compile_threads or compilation.compile_threads(compiles.compiles),
    "batches_per_second": rate, "mean_batch_positions": positions / batches,
    "real_token_fraction": train.real_token_fraction(),
    "train_examples": len(split), "kept_examples": train.num_examples,
    "token_cache_bytes": cache_bytes,
    # The packed epoch plans written beside the cache (plan_cache), so far.
    "plan_bytes": measure.tree_bytes(os.path.join(cache_dir, "plans")),
    "steps_per_epoch": train.steps_per_epoch,
  }


def accelerator_batches_per_second(config: Any) -> dict[str, float]:
  """Batches per second an accelerator consumes at MFU 0.4 for the config's real model."""
  tokens = int(config.data.tokens_per_batch)  # positions per side
  flops = hardware.model_flops_per_step(measure.param_count(config), tokens, tokens)
  return {name: peak * MFU / flops for name, peak in ACCELERATORS.items()}


def _run_start(label: str, argv: list[str], timeout: float) -> dict[str, Any]:
  """One start in a fresh process (`--child`), which prints its result as a JSON line."""
  cmd = [sys.executable, "-m", "benchmarks.pipeline", *argv, "--child"]
  try:
    result = measure.run_json(cmd, timeout)
  except RuntimeError as e:
    fail(f"the {label}: {e}")
  result["process_seconds"] = result.pop("wall_s")
  return result


def report_parts(config: Any, tiny: bool, runs: dict[str, dict[str, Any]],
                 warm: dict[str, Any], need: dict[str, float]) -> dict[str, Any]:
  """`report.write`'s title, intro, body and record: `runs` are the first start and the
  restart, `warm` the restart with the first start's compilation cache."""
  gib = 2.0**30
  rows = []
  for label, run in {**runs, WARM: warm}.items():
    for s in run["stages"]:
      rows.append([label, s["stage"], f"{s['seconds']:.1f}", f"{s['peak_rss_bytes'] / gib:.2f}"])
    data = max(s["peak_rss_bytes"] for s in run["stages"] if s["stage"] in DATA_STAGES)
    rows.append([label, "**to the first step** (peak: data path)",
                 f"**{run['to_first_step_seconds']:.1f}**", f"**{data / gib:.2f}**"])
    rows.append([label, "whole process (with imports)", f"{run['process_seconds']:.1f}", ""])
  restart = runs["restart"]
  setting = (
    f"Dataset `{config.dataset}` ({restart['train_examples']:,} training pairs, "
    f"{restart['kept_examples']:,} within the length limits), vocabulary "
    f"{config.data.vocab_size}, {config.data.tokens_per_batch} tokens per batch and side, "
    f"buckets {config.data.bucket_lengths}; model "
    f"{'tiny (1 + 1 layers, d_model 32)' if tiny else 'as configured'}.\n")
  body = [
      setting, "## Results\n",
      report.markdown_table(["start", "stage", "seconds", "peak RSS (GiB)"], rows),
      f"- Peak RSS of the data path is the largest of the stages open ... batch plan. The first "
      f"step adds the step's own buffers: XLA accounts {restart['step_xla_bytes'] / gib:.2f} "
      f"GiB for a batch of shape {restart['first_batch_shape']} (the logits and their gradient "
      f"over the {config.data.vocab_size:,}-piece vocabulary dominate); on a CPU they are host "
      "memory, on a GPU or TPU they are device memory.",
      f"- Token cache of the training split on disk: {restart['token_cache_bytes'] / gib:.2f} "
      "GiB.",
      f"- Host batch rate (the training loop's prefetch thread: gather from the memory-mapped "
      f"cache, pad, transfer): **{restart['batches_per_second']:.1f} batches/s** "
      f"({restart['mean_batch_positions']:,.0f} positions per side per batch).",
      "- An accelerator at MFU 0.4 on the configured model (`hardware.model_flops_per_step`: 6 x "
      "parameters x tokens per step, a token being a source and a target position) consumes: "
      + ", ".join(f"{k} {v:.1f} batches/s" for k, v in need.items()) +
      "; the host covers " + ", ".join(f"{restart['batches_per_second'] / v:.1f}x of {k}"
                                       for k, v in need.items()) + ".",
      f"- Real (non-padding) tokens: **{restart['real_token_fraction']:.3f}** of the batches' "
      "positions over an epoch, both sides (the padding of partly filled rows and the all-zero "
      "rows that round a batch up to the devices both count as padding).\n",
      "## Restart with a warm compilation cache\n",
      report.markdown_table(
        ["restart", "compile (s)", "compile threads", "programs loaded from the cache",
         "to the first step (s)"],
        [[label, f"{r['compile_seconds']:.1f}", r["compile_threads"],
          f"{r['programs_from_cache']} of {r['programs_compiled']}",
          f"{r['to_first_step_seconds']:.1f}"]
         for label, r in (("empty compilation cache", restart), ("warm compilation cache", warm))]),
      f"- The warm cache takes the restart to the first step in "
      f"**{warm['to_first_step_seconds'] / restart['to_first_step_seconds']:.2f}x** the time "
      f"of the restart with an empty one; the ahead-of-time compile of every training and "
      f"evaluation batch shape takes "
      f"{warm['compile_seconds'] / max(restart['compile_seconds'], 1e-9):.2f}x. Both are "
      "part of the first step's stage, with the sharded init (whose program is cached too) and "
      "one step.\n"]
  return {"title": "The data path at full size: first start and restart",
          "intro": "Made by `benchmarks/pipeline.py` (method in its docstring), a section per "
                   "corpus, config and setting (`--section`, by default the config's name).",
          "body": body,
          "record": {"runs": runs, "warm_compilation_cache": warm, "need": need}}


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags

  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/wmt.py.",
                                            lock_config=False)
  _WORKDIR = flags.DEFINE_string("workdir", None, "Workdir of the benchmark (emptied first).")
  _TINY = flags.DEFINE_bool("tiny_model", True, "Replace the model by 1 + 1 layers of width 32.")
  _BATCHES = flags.DEFINE_integer("batches", 1000, "Batches timed for the host's batch rate.")
  _OUT = flags.DEFINE_string("out", os.path.join("benchmarks", "results", "pipeline"),
                             "Report path without extension (.md and .json).")
  _SECTION = flags.DEFINE_string("section", None, "The report's section this run writes (the "
                                 "others are kept); default: the config's name.")
  _CHILD = flags.DEFINE_bool("child", False, "Internal: run one start, print its JSON line.")
  _COMPILE_THREADS = flags.DEFINE_integer(
    "compile_threads", 0, "Threads that compile the batch shapes' programs; 0: as training does "
    "(transformer.compilation.compile_threads).")

  def main(argv: list[str]) -> None:
    del argv
    config = _CONFIG.value
    if config is None or _WORKDIR.value is None:
      fail("--config and --workdir are required, e.g. --config=configs/wmt.py "
           "--config.data_dir=/tmp/synth_wmt --workdir=/tmp/pipeline_bench")
    if _CHILD.value:
      if _TINY.value:
        config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=4)
      print(json.dumps(one_start(config, _WORKDIR.value, _BATCHES.value,
                                  _COMPILE_THREADS.value)), flush=True)
      return
    shutil.rmtree(_WORKDIR.value, ignore_errors=True)
    # The first start fills `warm`; the restart compiles into an empty directory.
    caches = tempfile.mkdtemp(prefix="pipeline-benchmark-jax-cache-")
    warm, empty = os.path.join(caches, "warm"), os.path.join(caches, "empty")
    runs = {}
    try:
      for label, cache in (("first start", warm), ("restart", empty), (WARM, warm)):
        argv = [*sys.argv[1:], f"--config.compilation_cache_dir={cache}"]
        runs[label] = _run_start(label, argv, timeout=6 * 3600)
        print(f"{label}: {runs[label]['to_first_step_seconds']:.1f} s to the first step "
              f"(compile {runs[label]['compile_seconds']:.1f} s)", flush=True)
    finally:
      shutil.rmtree(caches, ignore_errors=True)
    warm_restart = runs.pop(WARM)
    need = accelerator_batches_per_second(config)
    report.write(_OUT.value, command=report.command_line(),
                 section=_SECTION.value or config.name,
                 **report_parts(config, _TINY.value, runs, warm_restart, need))
    print(f"wrote {_OUT.value}.md", flush=True)

  app.run(main, flags_parser=flags_parser())
