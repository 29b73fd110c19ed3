"""Your own parallel corpus from plain-text files: `configs/text.py[:SRC-TGT][,tsv][,small]`.

Two line-aligned files per split, one per language (line i of one translates line i of the
other), given by language code:

    python -m transformer.main --config=configs/text.py:en-de \
        --config.data.train_files.en=corpus/train.en --config.data.train_files.de=corpus/train.de

or one file of `source<TAB>target` lines per split (`:en-de,tsv`):

    python -m transformer.main --config=configs/text.py:en-de,tsv \
        --config.data.train_files=corpus/train.tsv

The argument's language pair sets `data.source_lang` and `data.target_lang` (default en-de) and
names the keys of the file fields. Fields:
  * `data.train_files`: the training corpus (required).
  * `data.eval_files`, `data.test_files`: validation and test files of the same form
    (optional). A split left unset is cut from the end of the training files:
    `data.heldout_pairs` pairs each (validation last, test before it), which training skips.
Files may be gzip'ed and local or `gs://...`. Pairs with an empty side are skipped and counted
in the log. The token cache and the vocabulary are keyed by the files' contents, so an edited
file is tokenized again and an unchanged one never is.

The model is a small Transformer (3 + 3 layers, d_model 256, 4 heads, pre-layer-norm, a shared
vocabulary of 8,000 pieces) on packed rows; `,small` takes the offline default's model instead
(2 + 2 layers, d_model 128: minutes on a CPU, for short sentences). Override any field, or start
from `configs/wmt.py` with `--config.dataset=text` for the paper's sizes.
"""

import re

from ml_collections import config_dict

from configs import common


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  parts = [p for p in (arg or "").split(",") if p]
  tsv, small = "tsv" in parts, "small" in parts
  pairs = [p for p in parts if p not in ("tsv", "small")]
  if len(pairs) > 1 or any(not re.fullmatch(r"[A-Za-z_]+-[A-Za-z_]+", p) for p in pairs):
    raise ValueError(f"bad argument {arg!r} of configs/text.py: use SRC-TGT (e.g. en-de), "
                     "optionally with ,tsv and ,small")
  src, tgt = (pairs[0] if pairs else "en-de").split("-")
  config = common.base_config()
  config.name = f"text-{src}-{tgt}"
  config.dataset = "text"
  config.data.source_lang = src
  config.data.target_lang = tgt

  def files() -> config_dict.ConfigDict | config_dict.FieldReference:
    if tsv:
      return config_dict.placeholder(str)
    return config_dict.ConfigDict({src: config_dict.placeholder(str),
                                   tgt: config_dict.placeholder(str)})

  config.data.train_files = files()
  config.data.eval_files = files()
  config.data.test_files = files()
  config.data.heldout_pairs = 500

  config.data.vocab_size = 8000
  config.data.spm_train_sentences = 500_000
  config.data.max_source_len = 128
  config.data.max_target_len = 128
  config.data.tokens_per_batch = 4096
  config.data.bucket_lengths = "auto"  # derived from the corpus (with data.packing=False)
  config.data.eval_batch_size = 64
  config.data.packing = True
  config.data.packed_source_len = 128
  config.data.packed_target_len = "auto"  # 128 x the corpus's target/source token ratio

  m = config.model
  m.vocab_size = config.data.get_ref("vocab_size")  # follows --config.data.vocab_size
  m.num_layers = 3
  m.d_model = 256
  m.d_ff = 1024
  m.num_heads = 4
  m.dropout_rate = 0.1
  m.pre_layer_norm = True  # trains stably with a short warm-up at this size
  m.max_len = 192  # max_source_len + decode.max_extra_len
  m.dtype = "auto"

  config.optimizer.warmup_steps = 1000
  config.num_train_steps = 5000
  config.log_every_steps = 100
  config.evals.valid_loss.every_steps = 1000
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 5
  config.average_last_checkpoints = 3
  config.evals.valid_translation.sentences = 500
  config.decode.max_extra_len = 64

  if small:
    # The offline default's sizes (configs/numbers.py): 2 + 2 layers, d_model 128, no dropout.
    config.data.tokens_per_batch = 2048
    config.data.max_source_len = config.data.max_target_len = 64
    config.data.packed_source_len = 64
    m.num_layers, m.d_model, m.d_ff, m.num_heads = 2, 128, 256, 4
    m.dropout_rate = 0.0
    m.pre_layer_norm = False
    m.max_len = 128
    config.optimizer.warmup_steps = 400
    config.num_train_steps = 2500
    config.evals.valid_translation.sentences = 200
    config.decode.max_extra_len = 10
  return config
