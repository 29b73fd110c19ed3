"""Fields shared by every config; each config file starts from `base_config()`."""

import dataclasses

from ml_collections import config_dict

from transformer.nn.model import ModelConfig
from transformer.training import evaluators


def corpus(dataset: str, *, weight: float = 1.0, tag: str = "",
           **data: object) -> config_dict.ConfigDict:
  """An entry of `config.data.corpora`: a corpus read as `dataset` ('text', 'numbers' or a TFDS
  builder) with its own data fields (`data`: e.g. train_files, source_lang, target_lang,
  heldout_pairs, train_split; the others are the main corpus's), its `weight` (an upsampling
  factor) and its `tag` ('' for none). Every field is present, so any can be overridden on the
  command line (`--config.data.corpora.NAME.weight=2`)."""
  from transformer.data import mixture

  entry = config_dict.ConfigDict({"dataset": dataset, "weight": float(weight), "tag": tag})
  for name in mixture.DATA_FIELDS:
    value = data.pop(name, None)
    entry[name] = config_dict.placeholder(object) if value is None else value
  if data:
    raise ValueError(f"corpus(): no such field {sorted(data)[0]!r}; fields: "
                     f"{', '.join(mixture.DATA_FIELDS)}")
  return entry


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
  # lengths derived from the training split (bucketing.derive_buckets). Any type, so that
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
  # Several corpora in one run (transformer/data/mixture.py, docs/data.md): the main corpus
  # above has `weight` (an upsampling factor) and `tag` (a token put in front of its sources,
  # e.g. '>>de<<'; '': none); more corpora are entries NAME = corpus(...) of `corpora`.
  config.data.weight = 1.0
  config.data.tag = ""
  config.data.corpora = config_dict.ConfigDict()

  # Every field of ModelConfig, so `ModelConfig(**config.model)` works.
  config.model = config_dict.ConfigDict(dataclasses.asdict(ModelConfig()))

  config.label_smoothing = 0.1
  # Gradient accumulation: each step runs its batch as this many micro-batches, one after the
  # other, and makes one update with the whole batch's mean gradient (less activation memory,
  # the same math; train_state.make_train_step). A checkpoint resumes with any value.
  config.grad_accum_steps = 1
  # Adam (section 5.3) on a learning-rate schedule (transformer/schedules.py; docs/training.md).
  config.optimizer = config_dict.ConfigDict()
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.98
  config.optimizer.eps = 1e-9
  # paper: lr = learning_rate_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
  #   (equation 3; learning_rate, warmup_init_lr and end_learning_rate unused).
  # inverse_sqrt (fairseq's): linear warm-up from warmup_init_lr to learning_rate at step
  #   warmup_steps, then learning_rate * sqrt(warmup_steps / step).
  # cosine: the same warm-up, then a half cosine from learning_rate down to end_learning_rate
  #   at step num_train_steps.
  # constant: the same warm-up (none if warmup_steps is 0), then learning_rate.
  config.optimizer.schedule = "paper"
  config.optimizer.warmup_steps = 4000  # in steps; at least 1 for paper and inverse_sqrt
  config.optimizer.learning_rate_scale = 1.0  # paper only
  # The peak of the other schedules; 7e-4 is about equation 3's peak for d_model 512 and
  # 4,000 warm-up steps (512^-0.5 * 4000^-0.5 = 6.99e-4).
  config.optimizer.learning_rate = 7e-4
  config.optimizer.warmup_init_lr = 0.0  # where their warm-up starts (step 0)
  config.optimizer.end_learning_rate = 0.0  # cosine: the rate at num_train_steps
  # > 0: AdamW, decoupled weight decay (Loshchilov & Hutter 2019): each update also subtracts
  # lr * weight_decay * param from the weight matrices and embeddings (not from biases and
  # LayerNorm scales); 0: Adam, as the paper. Turning it on or off needs a new workdir.
  config.optimizer.weight_decay = 0.0
  # > 0: the train state also keeps ema = ema_decay * ema + (1 - ema_decay) * params after
  # every update (Marian's --exponential-smoothing), and evaluation, translation and export
  # use it instead of the parameters; e.g. 0.9999. 0: off. Turning it on or off needs a new
  # workdir; its value may change on resume.
  config.optimizer.ema_decay = 0.0
  # 0: no clipping (the paper does not clip). Turning it on or off needs a new workdir.
  config.optimizer.grad_clip_norm = 0.0

  config.num_train_steps = 1000
  config.log_every_steps = 50
  # What is measured (transformer/training/evaluators.py): each entry one evaluator, run every
  # `every_steps` steps by the loop (0: only in the final evaluation, which runs them all).
  # Metrics are PREFIX/NAME: eval/loss, eval/perplexity, eval/bleu, test/bleu, ...
  # valid_loss (eval/loss, eval/perplexity, ...) every 500 steps; valid_translation and
  # test_translation (eval/bleu, test/bleu, chrf, ter) at the end, on all sentences.
  config.evals = evaluators.default_evals()
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 3
  config.average_last_checkpoints = 0  # 0 or 1: final evaluation uses the newest checkpoint
  # The best checkpoint (transformer/training/best_checkpoint.py): a metric of a periodic evaluator,
  # e.g. 'eval/bleu' ('max') or 'eval/loss' ('min'); its best step is kept in <workdir>/best,
  # apart from the newest keep_checkpoints, and the final evaluation uses it. '': none.
  config.best_checkpoint = config_dict.ConfigDict()
  config.best_checkpoint.metric = ""
  config.best_checkpoint.mode = "max"
  # Early stopping: `patience` evaluations of the best checkpoint's metric in a row without an
  # improvement of more than `min_delta` end the run (0: never).
  config.early_stopping = config_dict.ConfigDict()
  config.early_stopping.patience = 0
  config.early_stopping.min_delta = 0.0
  # Fine-tuning (transformer/training/finetune.py): start from another workdir's parameters
  # (its best checkpoint, else its newest; local or gs://, or an imported model's workdir) and its
  # vocabulary, with a fresh optimizer at step 0 and this config's schedule; '': from scratch.
  config.init_from = ""
  config.init_from_optimizer = False  # also take the source's Adam moments

  config.decode = config_dict.ConfigDict()
  config.decode.beam_size = 4
  config.decode.alpha = 0.6
  config.decode.max_extra_len = 50  # maximum output length = input length + this
  config.decode.batch_size = 64  # global, at most this many sentences per decoding batch
  # ... and at most this many padded source tokens per batch (global, over the mesh).
  config.decode.tokens_per_batch = 4096
  # Beam and greedy search keep decode.batch_size sentences searching (greedy: beam_size times
  # as many, the same rows) and give a stopped sentence's place to the next one of its length
  # (in-flight batching, transformer/decoding/inflight.py); False: each batch searches until its
  # last sentence stops.
  config.decode.in_flight = True
  # beam (the paper's search) | greedy | sample (ancestral sampling, e.g. for back-translation)
  # | mbr (minimum Bayes risk over candidates, below)
  config.decode.method = "beam"
  # Sampling only: logits / temperature, then the top_k most likely tokens (0: all), then the
  # smallest set whose probability reaches top_p (1.0: all); seed fixes the draws.
  config.decode.temperature = 1.0
  config.decode.top_k = 0
  config.decode.top_p = 1.0
  config.decode.seed = 0
  # mbr: minimum Bayes risk decoding (transformer/decoding/mbr.py): mbr_candidates candidates
  # from mbr_sampler ('sample', with the fields above, or 'beam': the n-best list, at most
  # beam_size), the one with the highest expected utility against the others (mbr_utility:
  # 'chrf' or 'bleu', sacrebleu's sentence scores).
  config.decode.mbr_candidates = 16
  config.decode.mbr_sampler = "sample"
  config.decode.mbr_utility = "chrf"
  # Never output the padding id (0); set for imported OPUS-MT models, whose configs forbid it.
  config.decode.suppress_padding = False
  # The tag put in front of every source line without one of its own, for a model trained on
  # tagged corpora (a multilingual model's '>>fr<<'); '': none.
  config.decode.tag = ""
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
