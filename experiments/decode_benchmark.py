"""Decoding-speed benchmark (the command; the method is in experiments/decoding.py).

    python -m experiments.decode_benchmark --config=configs/wmt.py:base \
        --batch_size=8 --src_len=32 --out_len=64 --beam_size=4 --repeats=3

times KV-cached greedy and beam search against uncached greedy decoding; the last line printed
is one JSON object.

    python -m experiments.decode_benchmark --peer=ctranslate2 --peer_batch_sizes=32,1 \
        --src_len=32 --out_len=64 --beam_size=4 --repeats=3

times the cached decoders against CTranslate2 float32 and int8 on the same (random) weights,
alternated in one run, and writes experiments/results/decode_vs_ctranslate2.md (or --report)
with the command and the machine. The config defaults to configs/wmt.py:base with float32 on
CPU and vocabulary 8192 (see `decoding.apply_defaults`).
"""

from __future__ import annotations

import json
import os

from absl import app, flags
from ml_collections import config_flags

from experiments import decoding, report
from transformer.errors import UserError, fail, flags_parser

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,  # DEFAULT_CONFIG, set in `parse`: a default here would be loaded outside it
  "Config file and variant (default configs/wmt.py:base), e.g. configs/numbers.py.",
  lock_config=True,
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Sentences per batch.")
_SRC_LEN = flags.DEFINE_integer("src_len", 32, "Source tokens per sentence (EOS included).")
_OUT_LEN = flags.DEFINE_integer("out_len", 64, "Output tokens per sentence (EOS included).")
_BEAM_SIZE = flags.DEFINE_integer("beam_size", 4, "Beams of the cached beam search (>= 2).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs of each decoder (best is kept).")
_WARMUP = flags.DEFINE_integer("warmup", 1, "Untimed runs of each decoder after compiling.")
_PEER = flags.DEFINE_enum("peer", None, list(decoding.PEERS),
                          "Compare against this library on the same weights instead.")
_PEER_BATCH_SIZES = flags.DEFINE_list("peer_batch_sizes", ["32", "1"],
                                      "--peer: the batch sizes to time.")
_THREADS = flags.DEFINE_integer("threads", None, "--peer: CTranslate2 threads (default: all "
                                "cores, as XLA's CPU runtime uses).")
_REPORT = flags.DEFINE_string(
  "report", os.path.join(decoding.ROOT, "experiments", "results", "decode_vs_ctranslate2.md"),
  "--peer: the markdown report to write ('' for none).")
FLAGS = flags.FLAGS


def overridden(field: str) -> bool:
  name = f"config.{field}"
  return name in FLAGS and FLAGS[name].present > 0


def _batch_sizes() -> tuple[int, ...]:
  try:
    return tuple(int(b) for b in _PEER_BATCH_SIZES.value)
  except ValueError:
    fail(f"--peer_batch_sizes={','.join(_PEER_BATCH_SIZES.value)}: integers expected")


def _peer(config) -> None:
  command = report.command_line()
  record = decoding.run_peer_benchmark(
    config, _batch_sizes(), _SRC_LEN.value, _OUT_LEN.value, _BEAM_SIZE.value, _REPEATS.value,
    _WARMUP.value, _THREADS.value, log=lambda message: print(message, flush=True),
  )
  table = decoding.peer_table(record)
  print(table, flush=True)
  if _REPORT.value:
    path = decoding.write_peer_report(_REPORT.value, record, report.public_command(command))
    print(f"report: {path}", flush=True)
  print(json.dumps(record), flush=True)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}; use --config.field=value")
  config = _CONFIG.value
  try:
    changes = decoding.apply_defaults(config, overridden)
  except OSError as e:  # ml_collections reports a config file it could not load only here
    fail(f"--config: {str(e).strip().splitlines()[0]} ({FLAGS['config'].config_filename})")
  for change in changes:
    print(f"default: {change}", flush=True)
  try:
    if _PEER.value:
      _peer(config)
      return
    record = decoding.run_benchmark(
      config, _BATCH_SIZE.value, _SRC_LEN.value, _OUT_LEN.value, _BEAM_SIZE.value,
      _REPEATS.value, _WARMUP.value, log=lambda message: print(message, flush=True),
    )
  except UserError as e:
    fail(str(e))
  for mode in decoding.MODES:
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


if __name__ == "__main__":
  app.run(main, flags_parser=flags_parser(config=decoding.DEFAULT_CONFIG))
