"""The workdir: every file of a run's directory named once, its config, and which parameters a
mode uses.

A workdir is self-contained: its config, vocabulary and checkpoints are all that translate,
score, export, average, evaluate and fine-tune (`init_from`) need, local or `gs://`. Its files:

    config.json          the run's config, every field with its type (`save`, `load`)
    vocab/spm.model      the SentencePiece vocabulary (an imported OPUS-MT model: vocab/marian/)
    checkpoints/<step>/  Orbax checkpoints: the train state and its metadata
    best/<step>/         the best evaluation's checkpoint (`config.best_checkpoint`)
    buckets.json         the bucket lengths training resolved (translation pads to them)
    metrics.jsonl, tb/   metrics, as JSON lines and TensorBoard events
    translations/        the evaluators' translations
    cache/               the token cache (unless `data.cache_dir`)
    profile/             profiler traces (`config.profile_steps`)
    .lock                held by the training run (storage.WorkdirLock)

`Paths` names them; nothing else joins a workdir file's name. `Choice` is which parameters a
mode uses: the newest checkpoint, the best one, a step (of `checkpoints/` or kept in `best/`)
or the average of the newest N (transformer/training/parameters.py restores them).

The config: training (or an import, transformer/interop/marian.py) writes `config.json` at its
first start (`save`; the only writer). The main program takes it as its config when `--config`
is not given with `--workdir`, by loading this file as a config file
(`--config=<this file>:<workdir>`, `get_config` below), so that `--config.decode.beam_size=8`
overrides it like any config file: every mode reads it, and training continues (or fine-tunes)
the workdir with it. A copied workdir therefore translates, scores and exports without the
training corpus or the config file it was trained with.

Decoding and evaluation fields may differ from the saved ones; a field that defines the model
or its data may not: `validate.check_same` names the first that differs. Optimizer fields may
differ too, as inference does not train; but whether the checkpoints' train state has a
clipping or weight-decay stage or the parameters' average (`optimizer.grad_clip_norm`,
`weight_decay`, `ema_decay` > 0; the average is what inference then uses) is the checkpoints'
own, and `run_meta.check_meta` refuses a config that turns one on or off.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
from typing import Any

from etils import epath
from ml_collections import config_dict

from transformer import storage
from transformer.errors import UserError

CONFIG = "config.json"
VOCAB = "vocab"
CHECKPOINTS = "checkpoints"
BEST = "best"
BUCKETS = "buckets.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tb"
TRANSLATIONS = "translations"
CACHE = "cache"
PROFILE = "profile"
LOCK = ".lock"


@dataclasses.dataclass(frozen=True)
class Paths:
  """The paths of one workdir's files (local or gs://), as `epath.Path`s."""

  root: epath.Path

  @property
  def config(self) -> epath.Path:
    return self.root / CONFIG

  @property
  def vocab(self) -> epath.Path:
    """The SentencePiece model training makes (data/vocabulary.py)."""
    return self.root / VOCAB / "spm.model"

  @property
  def marian_vocab(self) -> epath.Path:
    """An imported OPUS-MT model's vocabulary: source.spm, target.spm, vocab.json."""
    return self.root / VOCAB / "marian"

  @property
  def vocab_dir(self) -> epath.Path:
    return self.root / VOCAB

  @property
  def checkpoints(self) -> epath.Path:
    return self.root / CHECKPOINTS

  @property
  def best(self) -> epath.Path:
    return self.root / BEST

  @property
  def buckets(self) -> epath.Path:
    return self.root / BUCKETS

  @property
  def metrics(self) -> epath.Path:
    return self.root / METRICS

  @property
  def tensorboard(self) -> epath.Path:
    return self.root / TENSORBOARD

  @property
  def translations(self) -> epath.Path:
    return self.root / TRANSLATIONS

  @property
  def cache(self) -> epath.Path:
    return self.root / CACHE

  @property
  def profile(self) -> epath.Path:
    return self.root / PROFILE

  @property
  def lock(self) -> epath.Path:
    return self.root / LOCK


def paths(workdir: str | os.PathLike) -> Paths:
  """The files of `workdir` (a local path or gs://...)."""
  return Paths(storage.as_path(workdir))


LATEST = "latest"


@dataclasses.dataclass(frozen=True)
class Choice:
  """Which parameters a mode uses: `checkpoint` 'latest', 'best' or a step number; `average`
  N > 1 (with 'latest' only) the mean of the newest N checkpoints."""

  checkpoint: str | int = LATEST
  average: int = 1

  @property
  def label(self) -> str:
    if self.average > 1:
      return f"average of the last {self.average}"
    return self.checkpoint if isinstance(self.checkpoint, str) else f"step {self.checkpoint}"


def parse_checkpoint(value: str | int | None) -> str | int:
  """`--checkpoint`: 'latest' (or None), 'best' or a step number (an int); else UserError."""
  if value is None or value == LATEST:
    return LATEST
  if value == BEST or isinstance(value, int):
    return value
  if not str(value).isdigit():
    raise UserError(f"--checkpoint={value}: must be 'best', 'latest' or a step number")
  return int(value)


def choose(checkpoint: str | int | None = None, average: int | None = None,
           default_average: int = 1) -> Choice:
  """The parameters asked for by `--checkpoint` and `--average` (None: `default_average`, the
  config's `average_last_checkpoints`, which applies to the newest checkpoint only)."""
  which = parse_checkpoint(checkpoint)
  if average is not None and average < 0:
    raise UserError(f"--average={average}: must be 0 or more (0 or 1: no averaging)")
  if which != LATEST:
    if average is not None and average > 1:
      raise UserError(f"--checkpoint={which} with --average={average}: an average is of the "
                      "newest checkpoints; give one of the two")
    return Choice(which, 1)
  n = default_average if average is None else average
  return Choice(LATEST, max(int(n), 1))
_TYPES = {t.__name__: t for t in (int, float, str, bool, list, tuple, dict, object)}


def path(workdir: str | os.PathLike) -> str:
  """`<workdir>/config.json`, as a string."""
  return os.fspath(paths(workdir).config)


def _encode(value: Any) -> Any:
  """JSON with tuples kept apart from lists (the axis rules are tuples)."""
  if isinstance(value, tuple):
    return {"__tuple__": [_encode(v) for v in value]}
  if isinstance(value, list):
    return [_encode(v) for v in value]
  return value


def to_json_value(value: Any) -> str:
  """A config value as the JSON text `config.json` holds for it (tuples marked as such)."""
  return json.dumps(_encode(value))


def _decode(value: Any) -> Any:
  if isinstance(value, dict) and set(value) == {"__tuple__"}:
    return tuple(_decode(v) for v in value["__tuple__"])
  if isinstance(value, list):
    return [_decode(v) for v in value]
  return value


def to_json(config: config_dict.ConfigDict) -> str:
  """Every field of `config` with its declared type (so None placeholders stay overridable)."""

  def walk(node: config_dict.ConfigDict) -> dict[str, Any]:
    out = {}
    for key in sorted(node.keys()):
      value = node[key]
      if isinstance(value, config_dict.ConfigDict):
        out[key] = {"fields": walk(value)}
      else:
        # A None that lost its placeholder's type (a resolved copy) is saved as `object`.
        field_type = node.get_type(key)
        if field_type is type(None):
          field_type = object
        out[key] = {"value": _encode(value),
                    "type": getattr(field_type, "__name__", "object")}
    return out

  return json.dumps({"config": walk(config)}, indent=1, sort_keys=True)


def from_json(text: str) -> config_dict.ConfigDict:
  def build(fields: dict[str, Any]) -> config_dict.ConfigDict:
    node = config_dict.ConfigDict()
    for key, entry in fields.items():
      if "fields" in entry:
        node[key] = build(entry["fields"])
      else:
        field_type = _TYPES.get(entry["type"], builtins.object)
        node[key] = config_dict.FieldReference(_decode(entry["value"]), field_type=field_type)
    return node

  return build(json.loads(text)["config"])


def save(config: config_dict.ConfigDict, workdir: str | os.PathLike) -> bool:
  """Writes `<workdir>/config.json` unless it exists (the first start's config is the run's);
  returns whether it wrote it."""
  target = paths(workdir).config
  if target.exists():
    return False
  storage.write_atomic(target, to_json(config))
  return True


# Fields added to the configs after workdirs were trained, with the default they take in a
# config saved before them, so that `--config.FIELD=...` overrides them there too.
ADDED_FIELDS: dict[str, Any] = {"decode.in_flight": True}


def load(workdir: str | os.PathLike) -> config_dict.ConfigDict | None:
  """The config saved in `workdir`, or None if it has none (trained before configs were saved);
  fields added since it was saved (`ADDED_FIELDS`) have their defaults."""
  source = paths(workdir).config
  if not source.exists():
    return None
  config = from_json(source.read_text())
  for name, default in ADDED_FIELDS.items():
    *parents, field = name.split(".")
    node = config
    for parent in parents:
      node = node.get(parent) if node is not None else None
    if node is not None and field not in node:
      node[field] = default
  return config


def get_config(workdir: str | None = None) -> config_dict.ConfigDict:
  """The config file interface: `--config=transformer/workdir.py:WORKDIR`."""
  if not workdir:
    raise ValueError("workdir_config.py needs the workdir: --config=workdir_config.py:WORKDIR")
  config = load(workdir)
  if config is None:
    raise ValueError(f"{path(workdir)} not found: pass --config (the config the run was "
                     "trained with, or for a new run a config file such as configs/numbers.py)")
  return config


def flag_value(argv: list[str], name: str) -> str | None:
  """The value of `--name=V` or `--name V` in argv (the last one), before absl parses it."""
  value = None
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      value = arg.split("=", 1)[1]
    elif arg == f"--{name}" and i + 1 < len(argv):
      value = argv[i + 1]
  return value


def with_workdir_config(argv: list[str]) -> list[str]:
  """argv with `--config=<workdir_config.py>:WORKDIR` added when a command has --workdir and
  no --config: the workdir's saved config is the default (of every mode but import, which
  writes a new workdir)."""
  mode = flag_value(argv, "mode") or "train"
  workdir = flag_value(argv, "workdir")
  if mode == "import" or workdir is None or flag_value(argv, "config") is not None:
    return argv
  return [argv[0], f"--config={__file__}:{workdir}", *argv[1:]]
