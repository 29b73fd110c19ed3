"""Decoding-speed benchmark (the command; the method is in experiments/decoding.py).

    python -m experiments.decode_benchmark --batch_size=8 --src_len=32 --out_len=64 \
        --beam_size=4 --repeats=3                      # -> experiments/results/decode.md
    python -m experiments.decode_benchmark --peer=ctranslate2 --peer_batch_sizes=32,1 \
        --src_len=32 --out_len=64 --beam_size=4 --repeats=3   # -> benchmark_vs_peer_decode.md

The first times KV-cached greedy and beam search against uncached greedy decoding, the second
against CTranslate2 float32 and int8 on the same (random) weights. Both print the table and,
last, one JSON object, and write the report (`--report`) with the command and the machine. The
config defaults to configs/wmt.py:base with float32 on CPU and vocabulary 8192
(`decoding.apply_defaults`).
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
_BEAM_SIZE = flags.DEFINE_integer("beam_size", 4, "Beams of the beam search (>= 2).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds (best is kept).")
_WARMUP = flags.DEFINE_integer("warmup", 1, "Untimed rounds after compiling.")
_PEER = flags.DEFINE_enum("peer", None, list(decoding.PEERS),
                          "Compare against this library on the same weights instead.")
_PEER_BATCH_SIZES = flags.DEFINE_list("peer_batch_sizes", ["32", "1"],
                                      "--peer: the batch sizes to time.")
_THREADS = flags.DEFINE_integer("threads", None, "--peer: CTranslate2 threads (default: all "
                                "cores, as XLA's CPU runtime uses).")
_PROFILE = flags.DEFINE_bool("profile", True, "Profile our greedy and beam search once more "
                             "each (untimed): where their time goes, in the report.")
_REPORT = flags.DEFINE_string(
  "report", None, "The markdown report ('' for none); default experiments/results/decode.md, "
  "with --peer benchmark_vs_peer_decode.md.")
FLAGS = flags.FLAGS


def overridden(field: str) -> bool:
  name = f"config.{field}"
  return name in FLAGS and FLAGS[name].present > 0


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
  batch_sizes = (_BATCH_SIZE.value,)
  if _PEER.value:
    try:
      batch_sizes = tuple(int(b) for b in _PEER_BATCH_SIZES.value)
    except ValueError:
      fail(f"--peer_batch_sizes={','.join(_PEER_BATCH_SIZES.value)}: integers expected")
  command = report.public_command(report.command_line())
  try:
    record = decoding.run_benchmark(
      config, batch_sizes, _SRC_LEN.value, _OUT_LEN.value, _BEAM_SIZE.value, _REPEATS.value,
      _WARMUP.value, _PEER.value, _THREADS.value, log=lambda message: print(message, flush=True),
      profile=_PROFILE.value)
  except UserError as e:
    fail(str(e))
  print(decoding.results_table(record), flush=True)
  path = _REPORT.value
  if path is None:
    name = "benchmark_vs_peer_decode.md" if _PEER.value else "decode.md"
    path = os.path.join(decoding.ROOT, "experiments", "results", name)
  if path:
    print(f"report: {decoding.write_report(path, record, command)}", flush=True)
  print(json.dumps(record), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=flags_parser(config=decoding.DEFAULT_CONFIG))
