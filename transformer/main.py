"""Entry point: `python -m transformer.main --config=configs/numbers.py [--workdir=DIR]`.

`--mode` picks one of the modes of transformer/modes.py (`modes.MODES`): `train` (the
default: train, evaluate, checkpoint, resume), `translate`, `score`, `average`, `export`,
`import` and `compare`; their flags are defined here and passed as a `modes.Request`.
Every mode works from `--workdir` alone: the run's config, saved there at its first start, is
the default (transformer/workdir.py); `--config.FIELD=VALUE` overrides its decoding and
evaluation fields, and training with it continues the run (or fine-tunes an imported model).
`compare` needs no config: the workdirs it compares bring their own.
A user error (bad config value, missing data, incompatible checkpoint) ends with one line on
stderr naming the field or path, and exit status 2.
"""

from __future__ import annotations

import logging as std_logging
import os
import sys

# TensorFlow is only used for reading data on the host; keep its C++ logging quiet.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# gs:// workdirs through gcsfs rather than tf.io.gfile (see transformer/storage.py); etils
# reads this when it first resolves a gs:// path.
os.environ.setdefault("EPATH_USE_TF", "false")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from transformer import (
  host_memory,  # noqa: E402
  modes,  # noqa: E402
)
from transformer import workdir as workdir_lib
from transformer.errors import fail  # noqa: E402
from transformer.errors import parse_flags as parse_flags_lib  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Config file, e.g. configs/numbers.py or configs/wmt.py:big.",
  lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Directory for checkpoints, vocabulary and metrics "
  "(default: runs/<config name>[-<variant>]).",
)
_MODE = flags.DEFINE_enum("mode", "train", list(modes.MODES), "What to do (transformer/modes.py).")
_INPUT = flags.DEFINE_string("input", None, "translate: read sentences from this file "
                             "instead of standard input; score: source<TAB>target lines; "
                             "compare: the sources the workdirs among --systems translate.")
_NBEST = flags.DEFINE_integer("nbest", 1, "translate: hypotheses per sentence (beam search: "
                              "at most decode.beam_size; sampling: samples per sentence).")
_OUTPUT_FORMAT = flags.DEFINE_string("output_format", "text", "translate: text (one line per "
                                     "hypothesis) or jsonl (one object per input line).")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "latest", "translate/score/export: 'latest', "
                                  "'best' (config.best_checkpoint) or a step number.")
_AVERAGE = flags.DEFINE_integer(
  "average", None, "translate/average/export: average the last N checkpoints (default: the "
  "config's average_last_checkpoints; translate and export use the newest checkpoint when it "
  "is 0 or 1).",
)
_FORMAT = flags.DEFINE_string("format", None, "export: the output format, ctranslate2 or marian "
                              "(a Hugging Face MarianMTModel directory).")
_OUTPUT = flags.DEFINE_string("output", None, "export: a new or empty directory to write to; "
                              "translate/score: a new file (resumed if interrupted), not "
                              "standard output; compare: a new JSON file.")
_SOURCE = flags.DEFINE_string(
  "source", None, "import: a Hugging Face Marian (OPUS-MT) model directory, as "
  "save_pretrained writes it (config.json, model.safetensors, source.spm, target.spm, "
  "vocab.json).")
_QUANTIZATION = flags.DEFINE_string(
  "quantization", None, "export: CTranslate2 weight type, e.g. int8 (default: float32).")
_ENSEMBLE = flags.DEFINE_list(
  "ensemble", [], "translate/score: WORKDIR[@CHECKPOINT],... decoded with --workdir as one "
  "model (CHECKPOINT: latest, best or a step), their log probabilities averaged at every step.")
_ENSEMBLE_WEIGHTS = flags.DEFINE_list(
  "ensemble_weights", [], "translate/score: one weight per model of the ensemble (--workdir "
  "first), normalised to sum to 1 (default: equal).")
_TARGET_PREFIX = flags.DEFINE_bool(
  "target_prefix", False, "translate: each input line is source<TAB>prefix; every hypothesis "
  "starts with the prefix (a line without a tab has none).")
_REFERENCES = flags.DEFINE_string("references", None, "compare: the reference translations, "
                                  "one per line.")
_SYSTEMS = flags.DEFINE_list(
  "systems", [], "compare: [NAME=]PATH,... the first the baseline; PATH a file of hypotheses "
  "or a workdir (WORKDIR@CHECKPOINT: latest, best or a step), which translates --input.")
_BOOTSTRAP = flags.DEFINE_integer("bootstrap_samples", 1000, "compare: paired bootstrap "
                                  "resamples.")
_TRIALS = flags.DEFINE_integer("randomization_trials", 10000, "compare: approximate "
                               "randomization trials.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "HOST:PORT of process 0, for multi-process runs.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_DISTRIBUTED = flags.DEFINE_bool(
  "distributed", False, "Initialise jax.distributed from the environment (TPU pods, SLURM, ...)."
)

_CPU_DEVICES = flags.DEFINE_integer(
  "cpu_devices", None, "JAX devices on a CPU (default: translate and score take one per core, "
  "each with at least 8 sentences of a batch, when the mesh is data-parallel; other modes one: "
  "transformer/cpu_devices.py).")

FLAGS = flags.FLAGS

# The modes that take one CPU device per core by default (transformer/cpu_devices.py).
TRANSLATING_MODES = ("translate", "score")


def default_workdir(config_arg: str) -> str:
  """runs/<config file name>[-<variant>] for --config=path/name.py[:variant]."""
  path, _, variant = config_arg.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  return os.path.join("runs", f"{name}-{variant}" if variant else name)


# The base config of an import (the fields that are not the model's), when --config is absent.
IMPORT_BASE = os.path.join("configs", "text.py")


def with_import_base(argv: list[str]) -> list[str]:
  """argv with `--config=<repository>/configs/text.py` added for `--mode=import` without
  --config, where the repository has it (an installed package has no configs/)."""
  if (workdir_lib.flag_value(argv, "mode") != "import"
      or workdir_lib.flag_value(argv, "config") is not None):
    return argv
  base = os.path.join(_PROJECT_DIR, IMPORT_BASE)
  return [argv[0], f"--config={base}", *argv[1:]] if os.path.exists(base) else argv


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, but a bad flag or config file is one line and exit status 2
  (`errors.parse_flags`); the workdir's config is the default (`with_workdir_config`)."""
  return parse_flags_lib(with_import_base(workdir_lib.with_workdir_config(argv)))


class _OwnInfoOnly(std_logging.Filter):
  """Shows INFO lines of this project only; libraries' INFO chatter (Orbax, TFDS) is hidden."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or _PROJECT_DIR in record.pathname


_PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str]) -> None:
  logging.get_absl_handler().addFilter(_OwnInfoOnly())
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}; fields are set with --config.field=value")
  config = _CONFIG.value
  without_config = _MODE.value in modes.WITHOUT_CONFIG
  if config is None and _MODE.value == "import":
    fail(f"--mode=import needs --config, the base of the fields that are not the model's "
         f"(e.g. {IMPORT_BASE} of the repository)")
  if config is None and not without_config:
    fail("--config is required, e.g. --config=configs/numbers.py"
         + ("" if _MODE.value == "train" else ", or --workdir of a trained run"))
  if _MODE.value == "import" and _WORKDIR.value is None:
    fail("--mode=import needs --workdir=DIR, a new or empty directory for the model")
  if _MODE.value == "import" and not _SOURCE.value:
    fail("--mode=import needs --source=DIR, a Hugging Face Marian model directory")
  import jax

  from transformer import cpu_devices
  from transformer.errors import UserError

  distributed = bool(_COORDINATOR.value or _DISTRIBUTED.value)
  try:
    count = cpu_devices.use(_CPU_DEVICES.value, config,
                            _MODE.value in TRANSLATING_MODES and not distributed)
  except UserError as e:
    fail(str(e))
  if count is not None:
    logging.info("%d JAX CPU devices (--cpu_devices, transformer/cpu_devices.py)", count)
  if distributed:
    jax.distributed.initialize(
      coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
      process_id=_PROCESS_ID.value,
    )
  if jax.process_index() != 0:
    logging.set_verbosity(logging.WARNING)
  logging.info("Host memory: %s", host_memory.state())

  workdir = _WORKDIR.value
  if workdir is None and not without_config:
    workdir = default_workdir(config_flags.get_config_filename(FLAGS["config"]) +
                              _variant_suffix())
    logging.info("No --workdir given: using %s", workdir)
    print(f"workdir: {workdir}", flush=True)
  try:
    from transformer import storage

    # Offline, gcsfs retries an unreachable bucket for minutes: ask the service once first.
    storage.check_reachable({"--workdir": workdir,
                             "--config": config.to_dict() if config is not None else None,
                             "TFDS_DATA_DIR": os.environ.get("TFDS_DATA_DIR")})
    request = modes.Request(
      input=_INPUT.value, output=_OUTPUT.value, nbest=_NBEST.value,
      output_format=_OUTPUT_FORMAT.value, checkpoint=_CHECKPOINT.value, average=_AVERAGE.value,
      format=_FORMAT.value, quantization=_QUANTIZATION.value, source=_SOURCE.value,
      ensemble=tuple(_ENSEMBLE.value), ensemble_weights=_weights(_ENSEMBLE_WEIGHTS.value),
      target_prefix=_TARGET_PREFIX.value,
      references=_REFERENCES.value, systems=tuple(_SYSTEMS.value),
      bootstrap_samples=_BOOTSTRAP.value, randomization_trials=_TRIALS.value)
    modes.MODES[_MODE.value](config, workdir, request)
  except UserError as e:
    fail(str(e))
  except FloatingPointError as e:
    # Training diverged; the checkpoints hold only finite parameters.
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(1)


def _weights(values: list[str]) -> tuple[float, ...]:
  try:
    return tuple(float(v) for v in values)
  except ValueError:
    fail(f"--ensemble_weights={','.join(values)}: must be numbers")


def _variant_suffix() -> str:
  arg = FLAGS["config"].serialize()  # e.g. --config=configs/wmt.py:big
  value = arg.split("=", 1)[-1]
  return ":" + value.split(":", 1)[1] if ":" in value else ""


def run() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  # Opt-in (TRANSFORMER_HUGE_PAGES=1), before JAX allocates anything and only as the command
  # itself: runs the same command again, once, with glibc's large blocks on huge pages
  # (transformer/host_memory.py).
  host_memory.use_huge_pages()
  run()
