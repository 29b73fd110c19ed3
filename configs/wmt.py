"""WMT14 English-to-German and English-to-French with the paper's recipe (Vaswani et al. 2017,
sections 5 and 6).

Variants: `configs/wmt.py:base` (default, Table 3 "base"), `:big` (Table 3 "big"), `:tiny`
(a CPU smoke test on the same code path); `:fr_base` and `:fr_big` for English-French
(`wmt14_translate/fr-en`, 36M pairs; Table 2). Every field can be overridden from the command
line, e.g. `--config.model.num_heads=16 --config.mesh.data=8`.
"""

from ml_collections import config_dict

from configs import common

VARIANTS = ("base", "big", "tiny", "fr_base", "fr_big")


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  variant = arg or "base"
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {variant!r} of configs/wmt.py: use {', '.join(VARIANTS)}")
  french = variant.startswith("fr_")
  size = variant.removeprefix("fr_")
  config = common.base_config()
  config.name = f"wmt-{variant}"
  config.dataset = "wmt14"
  if french:
    # Section 5.1: "the significantly larger WMT 2014 English-French dataset consisting of 36M
    # sentences", "split tokens into a 32000 word-piece vocabulary".
    config.dataset = "wmt14_translate/fr-en"
    config.data.target_lang = "fr"

  # Section 5.1: byte-pair encoding with a shared source-target vocabulary of about 37,000
  # tokens; batches of about 25,000 source and 25,000 target tokens.
  config.data.vocab_size = 32000 if french else 37000
  # The vocabulary is trained on a sample of 500k pairs (1M sentences, drawn by index from
  # the stream): SentencePiece's time and memory grow with its input (1M pairs took 447 s and
  # 6.4 GiB on 2 cores, 500k 224 s and 3.6 GiB: benchmarks/results/pipeline.md
  # and pipeline.md), and 1M sentences is plenty for 37,000 pieces.
  config.data.spm_train_sentences = 500_000
  config.data.tokens_per_batch = 25000
  config.data.max_source_len = 256
  config.data.max_target_len = 256
  # Packed rows of 256 tokens a side, several pairs each, as flax's WMT example, t5x and MaxText
  # train: ~0.98 of the positions are real tokens, against ~0.81 in length buckets
  # (benchmarks/results/packing.md, wmt-base). `--config.data.packing=False` trains on length
  # buckets instead, derived from the training split ('auto') unless a list is given.
  config.data.packing = True
  config.data.packed_source_len = 256
  config.data.packed_target_len = "auto"  # 256 x the corpus's target/source token ratio
  config.data.bucket_lengths = "auto"
  config.data.eval_batch_size = 128

  # Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=d_model/h=64, P_drop=0.1.
  m = config.model
  m.vocab_size = config.data.vocab_size
  m.num_layers = 6
  m.d_model = 512
  m.d_ff = 2048
  m.num_heads = 8
  m.d_kv = 0  # 0: d_k = d_v = d_model / h (64 for base and big)
  m.dropout_rate = 0.1
  m.max_len = 320  # covers max_target_len + 50 for decoding
  m.dtype = "auto"  # bfloat16 compute on GPU/TPU, float32 on CPU; parameters stay float32

  config.label_smoothing = 0.1  # epsilon_ls, section 5.4
  config.optimizer.b1 = 0.9  # section 5.3
  config.optimizer.b2 = 0.98
  config.optimizer.eps = 1e-9
  config.optimizer.warmup_steps = 4000
  config.optimizer.learning_rate_scale = 1.0

  config.num_train_steps = 100_000  # base: 100k steps (12 hours on 8 P100s)
  config.log_every_steps = 100
  config.evals.valid_loss.every_steps = 5000
  config.evals.valid_translation.every_steps = 10_000
  config.checkpoint_every_steps = 1000  # the paper wrote one every 10 minutes
  config.keep_checkpoints = 20
  config.average_last_checkpoints = 5  # base: the last 5 checkpoints, big: the last 20

  # Section 6.1: beam size 4, length penalty alpha 0.6, maximum output length input + 50.
  config.decode.beam_size = 4
  config.decode.alpha = 0.6
  config.decode.max_extra_len = 50
  config.evals.valid_translation.sentences = 0  # 0: the whole newstest2013 for validation BLEU
  # Test BLEU also as the paper computed it: tokenized, compound words split.
  config.evals.test_translation.metrics = "bleu,chrf,ter,bleu_tokenized"

  if size == "big":
    # Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 for EN-DE; 300k steps.
    # Section 6.1: the big EN-FR model "used dropout rate P_drop = 0.1, instead of 0.3".
    m.d_model = 1024
    m.d_ff = 4096
    m.num_heads = 16
    m.dropout_rate = 0.1 if french else 0.3
    config.num_train_steps = 300_000
    config.average_last_checkpoints = 20
  elif size == "tiny":
    # Same code path, CPU-sized: used by the tests under tfds.testing.mock_data.
    config.data.vocab_size = m.vocab_size = 256
    config.data.spm_train_sentences = 2000
    config.data.tokens_per_batch = 512
    config.data.max_source_len = 32
    config.data.max_target_len = 32
    config.data.bucket_lengths = [16, 32]
    config.data.packed_source_len = config.data.packed_target_len = 32
    config.data.eval_batch_size = 16
    m.num_layers = 1
    m.d_model = 32
    m.d_ff = 64
    m.num_heads = 4
    m.max_len = 96
    config.optimizer.warmup_steps = 10
    config.num_train_steps = 4
    config.log_every_steps = 2
    config.evals.valid_loss.every_steps = 4
    config.evals.valid_translation.every_steps = 4
    config.checkpoint_every_steps = 2
    config.keep_checkpoints = 3
    config.average_last_checkpoints = 2
    config.decode.max_extra_len = 5
    config.evals.valid_translation.sentences = 16
  return config
