"""The PyTorch peer of our training-step benchmark: torch.nn.Transformer at the same shapes.

    python -m venv /tmp/torch-peer && /tmp/torch-peer/bin/pip install -r requirements-peer.txt
    /tmp/torch-peer/bin/python benchmarks/torch_peer.py --repeats 3

(`python -m benchmarks.torch_peer` works too.) `benchmarks/compare_peer.py` runs it by default,
alternated with `benchmarks.train_step`. It needs only torch: it imports nothing from the
project, and torch only inside `main`, so that this file can be imported (for its FLOP count)
where torch is missing.

The model is the paper's base Transformer on torch.nn.Transformer, set as our model is by
default: post-layer-norm without the final encoder and decoder norms that nn.Transformer adds
(`--pre_layer_norm`: norm first in every sublayer, with those final norms, as ours with
`model.pre_layer_norm=True`), embeddings times sqrt(d_model) plus sinusoidal positions,
dropout on those sums and inside every sublayer, one embedding matrix shared by source, target
and the output projection, the decoder fed the targets shifted right (0 first) under a causal
mask. Loss: cross-entropy with label smoothing (torch's form: eps / V on every token; ours
puts eps / (V - 1) on the others, which costs the same). Adam(0.9, 0.98, 1e-9) with the
paper's learning-rate schedule. Default shapes: vocabulary 8192, d_model 512, 6 + 6 layers,
8 heads, d_ff 2048, dropout 0.1, label smoothing 0.1, batch 32 x 64 source + 64 target tokens,
random ids in [2, vocab), no padding.

Measured as `benchmarks/train_step.py` measures ours:
  - `--warmup_steps` untimed steps, then `--repeats` timed ones, each on its own batch made
    before the clock starts; a step ends with `loss.item()`, which waits for it. step_s is the
    best of the timed steps; the median and the least CPU time (all threads) are reported too.
  - model_flops_per_step by the project's formula, 6 x this model's parameters x tokens / 2
    (`model_flops_per_step` below, a copy; tests/test_benchmark.py checks that the two agree).
  - matmul_flops_per_s: the best of `--matmul_repeats` float32 [n, n] @ [n, n] products
    (n = `--matmul_size`) after two warm-up products, in this process, after the steps.
    `matmul_peak_flops` is the same number under the name compare_peer reads.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  import torch

# Python names of the defaults: the paper's base model at the benchmark's shapes.
DEFAULTS = {
  "vocab": 8192, "d_model": 512, "layers": 6, "heads": 8, "d_ff": 2048, "dropout": 0.1,
  "label_smoothing": 0.1, "batch_size": 32, "src_len": 64, "tgt_len": 64, "pre_layer_norm": False,
}
INSTALL = "pip install -r requirements-peer.txt"


def model_flops_per_step(params: int, source_tokens: float, target_tokens: float) -> float:
  """Model FLOPs of one training step: 6 x parameters x (source + target) / 2 tokens.

  A copy of the project's one count (`transformer.hardware.model_flops_per_step`; this file
  imports nothing from the project; tests/test_benchmark.py checks that the two agree): 2
  FLOPs per parameter per token forward and 4 backward, and a token goes through about half
  of an encoder-decoder's parameters. Attention products, embedding lookups, layer norms,
  softmax, dropout and the optimiser are not counted.
  """
  return 6.0 * params * (source_tokens + target_tokens) / 2


def _positive(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
  return value


def _non_negative(text: str) -> int:
  value = int(text)
  if value < 0:
    raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
  return value


def _probability(text: str) -> float:
  value = float(text)
  if not 0.0 <= value < 1.0:
    raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
  return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  """The command line (defaults: the base shapes); exits with status 2 on a bad value."""
  p = argparse.ArgumentParser(
    prog="benchmarks/torch_peer.py",
    description="One training step of torch.nn.Transformer, timed; prints one JSON line.",
  )
  d = DEFAULTS
  p.add_argument("--vocab", type=_positive, default=d["vocab"], help="vocabulary size")
  p.add_argument("--d_model", type=_positive, default=d["d_model"])
  p.add_argument("--layers", type=_positive, default=d["layers"],
                 help="encoder layers, and as many decoder layers")
  p.add_argument("--heads", type=_positive, default=d["heads"])
  p.add_argument("--d_ff", type=_positive, default=d["d_ff"])
  p.add_argument("--pre_layer_norm", action="store_true", default=d["pre_layer_norm"],
                 help="x + Sublayer(LayerNorm(x)), with a final norm after each stack")
  p.add_argument("--dropout", type=_probability, default=d["dropout"])
  p.add_argument("--label_smoothing", type=_probability, default=d["label_smoothing"])
  p.add_argument("--batch_size", "--batch", type=_positive, default=d["batch_size"],
                 help="rows per batch")
  p.add_argument("--src_len", type=_positive, default=d["src_len"])
  p.add_argument("--tgt_len", type=_positive, default=d["tgt_len"])
  p.add_argument("--lr_warmup", type=_positive, default=4000,
                 help="warm-up steps of the learning-rate schedule (section 5.3)")
  p.add_argument("--warmup_steps", type=_non_negative, default=2, help="untimed steps")
  p.add_argument("--repeats", "--steps", type=_positive, default=5, help="timed steps")
  p.add_argument("--matmul_size", type=_positive, default=2048)
  p.add_argument("--matmul_repeats", type=_positive, default=5)
  p.add_argument("--threads", type=_non_negative, default=0, help="0: torch's default")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  if args.d_model % args.heads:
    p.error(f"--d_model={args.d_model} is not divisible by --heads={args.heads}")
  if args.vocab < 3:
    p.error(f"--vocab={args.vocab}: must be >= 3 (ids 0 and 1 are reserved)")
  return args


def sinusoidal_positions(length: int, d_model: int) -> torch.Tensor:
  """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same). [n, d]."""
  import torch

  pos = torch.arange(length, dtype=torch.float64)[:, None]
  rates = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
  angle = pos / rates
  pe = torch.zeros(length, d_model, dtype=torch.float64)
  pe[:, 0::2] = torch.sin(angle)
  pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
  return pe.float()


def build_model(args: argparse.Namespace) -> torch.nn.Module:
  """nn.Transformer with shared embeddings and sinusoidal positions; forward(src, tgt_in)."""
  import torch
  from torch import nn

  class PeerTransformer(nn.Module):
    def __init__(self) -> None:
      super().__init__()
      d = args.d_model
      self.scale = math.sqrt(d)
      self.embedding = nn.Embedding(args.vocab, d)
      nn.init.normal_(self.embedding.weight, std=d**-0.5)  # unit scale after sqrt(d), as ours
      positions = sinusoidal_positions(max(args.src_len, args.tgt_len), d)
      self.register_buffer("positions", positions, persistent=False)
      self.dropout = nn.Dropout(args.dropout)
      with warnings.catch_warnings():  # its inference-only nested-tensor path is off anyway
        warnings.filterwarnings("ignore", message="enable_nested_tensor")
        self.core = nn.Transformer(d, args.heads, args.layers, args.layers, args.d_ff,
                                   dropout=args.dropout, batch_first=True,
                                   norm_first=args.pre_layer_norm)
      if not args.pre_layer_norm:
        # Post-layer-norm as in the paper: no norm after the last layer of either stack.
        self.core.encoder.norm = None
        self.core.decoder.norm = None

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
      x = self.embedding(ids) * self.scale + self.positions[: ids.shape[1]]
      return self.dropout(x)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
      causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1])
      h = self.core(self.embed(src), self.embed(tgt_in), tgt_mask=causal, tgt_is_causal=True)
      return torch.nn.functional.linear(h, self.embedding.weight)  # tied output projection

  return PeerTransformer()


def measure_matmul_flops(n: int = 2048, repeats: int = 5) -> float:
  """The best float32 FLOP/s of an [n, n] @ [n, n] product with torch on the CPU."""
  import torch

  x, y = torch.randn(n, n), torch.randn(n, n)
  for _ in range(2):
    x @ y
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    x @ y
    times.append(time.perf_counter() - t)
  return 2 * n**3 / min(times)


def run(args: argparse.Namespace) -> dict[str, Any]:
  """Builds the model, times the steps and the matmul; returns the JSON record."""
  import torch

  if args.threads:
    torch.set_num_threads(args.threads)
  torch.manual_seed(args.seed)
  model = build_model(args)
  model.train()
  opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
  d, warm = args.d_model, args.lr_warmup
  schedule = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda i: d**-0.5 * min((i + 1) ** -0.5, (i + 1) * warm**-1.5))
  loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)

  gen = torch.Generator().manual_seed(args.seed)
  batches = []
  for _ in range(args.warmup_steps + args.repeats):
    src = torch.randint(2, args.vocab, (args.batch_size, args.src_len), generator=gen)
    tgt = torch.randint(2, args.vocab, (args.batch_size, args.tgt_len), generator=gen)
    tgt_in = torch.cat([torch.zeros_like(tgt[:, :1]), tgt[:, :-1]], dim=1)  # shifted right
    batches.append((src, tgt_in, tgt))

  times, cpu_times, faults = [], [], []
  for src, tgt_in, tgt in batches:
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c = time.process_time()
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    logits = model(src, tgt_in)
    step_loss = loss_fn(logits.reshape(-1, args.vocab), tgt.reshape(-1))
    step_loss.backward()
    opt.step()
    schedule.step()
    loss = step_loss.item()  # waits for the step
    times.append(time.perf_counter() - t)
    cpu_times.append(time.process_time() - c)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)
  if not math.isfinite(loss):
    raise RuntimeError(f"the peer's step produced a non-finite loss ({loss})")
  timed, timed_cpu = times[args.warmup_steps:], cpu_times[args.warmup_steps:]
  params = sum(p.numel() for p in model.parameters())
  del model, opt, batches, logits, step_loss  # free them before the matmul

  matmul = measure_matmul_flops(args.matmul_size, args.matmul_repeats)
  flops = model_flops_per_step(params, args.batch_size * args.src_len,
                               args.batch_size * args.tgt_len)
  tokens = args.batch_size * (args.src_len + args.tgt_len)
  best = min(timed)
  return {
    "peer": "torch.nn.Transformer",
    "tokens_per_s": tokens / best,
    "step_s": best,
    "step_s_stat": "best",
    "step_s_median": statistics.median(timed),
    "step_times_s": timed,
    "step_cpu_s": min(timed_cpu),
    "step_cpu_s_median": statistics.median(timed_cpu),
    "step_minor_faults": statistics.median_low(faults[args.warmup_steps:]),
    "first_step_s": times[0],
    "model_flops_per_step": flops,
    "achieved_flops_per_s": flops / best,
    "matmul_flops_per_s": matmul,
    "matmul_peak_flops": matmul,  # the same, under the name compare_peer reads
    "fraction_of_matmul_peak": flops / best / matmul,
    "matmul_size": args.matmul_size,
    "tokens_per_step": tokens,
    "last_loss": loss,
    "params": params,
    "batch_size": args.batch_size,
    "src_len": args.src_len,
    "tgt_len": args.tgt_len,
    "steps": args.repeats,
    "warmup_steps": args.warmup_steps,
    "d_model": args.d_model,
    "layers": args.layers,
    "heads": args.heads,
    "d_ff": args.d_ff,
    "pre_layer_norm": args.pre_layer_norm,
    "vocab": args.vocab,
    "dtype": "float32",
    "dropout": args.dropout,
    "label_smoothing": args.label_smoothing,
    "lr_warmup": args.lr_warmup,
    "seed": args.seed,
    "torch": torch.__version__,
    "threads": torch.get_num_threads(),
    "cpu_count": os.cpu_count(),
  }


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  try:
    import torch  # noqa: F401
  except ImportError as e:
    print(f"error: benchmarks/torch_peer.py needs PyTorch ({e}); in a separate environment: "
          f"{INSTALL}", file=sys.stderr, flush=True)
    sys.exit(2)
  record = run(args)
  print(f"{record['tokens_per_s']:.0f} tokens/s, step {record['step_s'] * 1e3:.1f} ms (best of "
        f"{record['steps']}; median {record['step_s_median'] * 1e3:.1f} ms), "
        f"{record['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s = "
        f"{100 * record['fraction_of_matmul_peak']:.1f}% of the measured matmul rate "
        f"({record['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s), torch {record['torch']}, "
        f"{record['threads']} threads", flush=True)
  print(json.dumps(record), flush=True)


if __name__ == "__main__":
  main()
