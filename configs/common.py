"""Fields shared by every config; each config file starts from `base_config()`."""

import dataclasses

from ml_collections import config_dict

from transformer.model import ModelConfig


def base_config() -> config_dict.ConfigDict:
  config = config_dict.ConfigDict()
  config.name = "base"
  # numbers | wmt14 | text (your own files: configs/text.py) | a TFDS builder name, e.g.
  # wmt14_translate/fr-en, wmt19_translate/de-en, ted_hrlr_translate/pt_to_en, para_crawl/ende.
  config.dataset = "numbers"
  config.data_dir = config_dict.placeholder(str)  # TFDS data dir; None: TFDS's default
  config.seed = 0

  config.data = config_dict.ConfigDict()
  config.data.source_lang = "en"
  config.data.target_lang = "de"
  # TFDS split strings of a TFDS corpus; slices and sums too: 'train[:10%]', 'train[5000:]'.
  config.data.train_split = "train"
  config.data.eval_split = "validation"
  config.data.test_split = "test"
  config.data.vocab_size = 256
  config.data.spm_train_sentences = 20000
  config.data.max_source_len = 64  # tokens incl. EOS; longer training pairs are dropped
  config.data.max_target_len = 64
  config.data.tokens_per_batch = 4096  # global, per side
  # Length buckets of unpacked batches (and of evaluation and decoding): a list, or 'auto' for
  # lengths derived from the training split (input_pipeline.derive_buckets). Any type, so that
  # either can be given on the command line.
  config.data.bucket_lengths = config_dict.FieldReference([16, 32, 64], field_type=object)
  config.data.eval_batch_size = 256  # global
  config.data.download = False  # allow TFDS to download and prepare missing data
  # Packed training batches (transformer/data/packing.py): rows of these fixed lengths hold
  # several pairs each, instead of one pair per row of a bucket's length.
  config.data.packing = False
  config.data.packed_source_len = 64
  # An int, or 'auto': packed_source_len scaled by the corpus's target/source token ratio.
  config.data.packed_target_len = config_dict.FieldReference(64, field_type=object)
  config.data.numbers_variant = "default"  # numbers corpus size: default (200k) | tiny (2k)
  # Tokenized training split (flat arrays, memory-mapped); None: <workdir>/cache.
  config.data.cache_dir = config_dict.placeholder(str)

  # Every field of ModelConfig, so `ModelConfig(**config.model)` works.
  config.model = config_dict.ConfigDict(dataclasses.asdict(ModelConfig()))

  config.label_smoothing = 0.1
  # Gradient accumulation: each step runs its batch as this many micro-batches, one after the
  # other, and makes one update with the whole batch's mean gradient (less activation memory,
  # the same math; train_state.make_train_step). A checkpoint resumes with any value.
  config.grad_accum_steps = 1
  config.optimizer = config_dict.ConfigDict()
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.98
  config.optimizer.eps = 1e-9
  config.optimizer.warmup_steps = 4000
  # lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)   (equation 3)
  config.optimizer.learning_rate_scale = 1.0
  config.optimizer.grad_clip_norm = 0.0  # 0: no clipping (the paper does not clip)

  config.num_train_steps = 1000
  config.log_every_steps = 50
  config.eval_every_steps = 500
  config.bleu_every_steps = 0  # 0: BLEU only at the end
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 3
  config.average_last_checkpoints = 0  # 0 or 1: final evaluation uses the newest checkpoint
  config.eval_bleu_sentences = 0  # validation sentences decoded for eval/bleu; 0: all

  config.decode = config_dict.ConfigDict()
  config.decode.beam_size = 4
  config.decode.alpha = 0.6
  config.decode.max_extra_len = 50  # maximum output length = input length + this
  config.decode.batch_size = 64  # global, at most this many sentences per decoding batch
  # ... and at most this many padded source tokens per batch (global, over the mesh).
  config.decode.tokens_per_batch = 4096
  # beam (the paper's search) | greedy | sample (ancestral sampling, e.g. for back-translation)
  config.decode.method = "beam"
  # Sampling only: logits / temperature, then the top_k most likely tokens (0: all), then the
  # smallest set whose probability reaches top_p (1.0: all); seed fixes the draws.
  config.decode.temperature = 1.0
  config.decode.top_k = 0
  config.decode.top_p = 1.0
  config.decode.seed = 0
  # Never output the padding id (0); set for imported OPUS-MT models, whose configs forbid it.
  config.decode.suppress_padding = False
  # Corpus translation reads and translates this many input lines at a time.
  config.decode.chunk_size = 10000
  config.num_samples_to_print = 5

  # What to do with a non-finite loss or gradient: 'skip' the update, or 'stop'.
  config.nonfinite = "skip"
  config.max_consecutive_nonfinite = 10

  # JAX's persistent compilation cache (transformer/compilation.py): None: a local directory
  # beside the token cache's local copies (also for a gs:// workdir); '': no cache.
  config.compilation_cache_dir = config_dict.placeholder(str)
  # A jax.profiler trace of steps FIRST:LAST (e.g. '200:205') in <workdir>/profile; '': none.
  config.profile_steps = ""

  # Device mesh; -1 takes the remaining devices.
  config.mesh = config_dict.ConfigDict()
  config.mesh.data = -1
  config.mesh.fsdp = 1
  config.mesh.tensor = 1
  # Logical axis -> mesh axes. Batch over data and fsdp, parameters over fsdp (ZeRO-3 style),
  # heads / mlp / vocab over tensor (Megatron style).
  config.logical_axis_rules = [
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("kv", None),
    ("embed", "fsdp"),
    ("layers", None),
  ]
  return config
