"""The run's config, saved in its workdir: every mode but training works from the workdir alone.

Training (or an import, transformer/marian.py) writes `<workdir>/config.json` at its first
start (every field, with its type). The main program takes it as its config when `--config` is
not given with `--workdir`, by loading this file as a config file
(`--config=<this file>:<workdir>`, `get_config` below), so that `--config.decode.beam_size=8`
overrides it like any config file: every mode reads it, and training continues (or fine-tunes)
the workdir with it. A copied workdir (local or
`gs://`) therefore translates, scores and exports without the training corpus or the config
file it was trained with.

Decoding and evaluation fields may differ from the saved ones; a field that defines the model
or its data (`FIXED`) may not: `check_same` names the first that differs. Optimizer fields may
differ too, as inference does not train; but whether the checkpoints' train state has a
clipping or weight-decay stage or the parameters' average (`optimizer.grad_clip_norm`,
`weight_decay`, `ema_decay` > 0; the average is what inference then uses) is the checkpoints'
own, and `checkpoint.check_meta` refuses a config that turns one on or off.
"""

from __future__ import annotations

import builtins
import json
import os
from typing import Any

from ml_collections import config_dict

FILE = "config.json"
# What defines the model and the vocabulary it was trained with.
FIXED = ("dataset", "model", "data")
# Fields under FIXED that only say how evaluation data is batched or where caches live.
FREE = ("data.eval_batch_size", "data.cache_dir", "data.download")
_TYPES = {t.__name__: t for t in (int, float, str, bool, list, tuple, dict, object)}


def path(workdir: str | os.PathLike) -> str:
  from transformer import storage

  return os.fspath(storage.as_path(workdir) / FILE)


def _encode(value: Any) -> Any:
  """JSON with tuples kept apart from lists (the axis rules are tuples)."""
  if isinstance(value, tuple):
    return {"__tuple__": [_encode(v) for v in value]}
  if isinstance(value, list):
    return [_encode(v) for v in value]
  return value


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
        field_type = node.get_ref(key).get_type()
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
  from transformer import storage

  target = storage.as_path(path(workdir))
  if target.exists():
    return False
  storage.write_atomic(target, to_json(config))
  return True


def load(workdir: str | os.PathLike) -> config_dict.ConfigDict | None:
  """The config saved in `workdir`, or None if it has none (trained before configs were saved)."""
  from transformer import storage

  source = storage.as_path(path(workdir))
  if not source.exists():
    return None
  return from_json(source.read_text())


def get_config(workdir: str | None = None) -> config_dict.ConfigDict:
  """The config file interface: `--config=transformer/workdir_config.py:WORKDIR`."""
  if not workdir:
    raise ValueError("workdir_config.py needs the workdir: --config=workdir_config.py:WORKDIR")
  config = load(workdir)
  if config is None:
    raise ValueError(f"{path(workdir)} not found: pass --config (the config the run was "
                     "trained with, or for a new run a config file such as configs/numbers.py)")
  return config


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(node, config_dict.ConfigDict | dict):
    out = {}
    for key in node.keys():
      out.update(_flat(node[key], f"{prefix}{key}."))
    return out
  return {prefix[:-1]: json.loads(json.dumps(_encode(node)))}


def _model_defaults() -> dict[str, Any]:
  """ModelConfig's defaults, as `_flat` gives them."""
  import dataclasses

  from transformer.model import ModelConfig

  return {k: json.loads(json.dumps(_encode(v))) for k, v in
          dataclasses.asdict(ModelConfig()).items()}


def check_same(saved: config_dict.ConfigDict, config: config_dict.ConfigDict) -> None:
  """Raises ConfigError naming the first model or data field where `config` differs from the
  `saved` one (decoding, evaluation and program fields may differ)."""
  from transformer.errors import ConfigError

  def fixed(c: config_dict.ConfigDict) -> dict[str, Any]:
    out = {}
    for name in FIXED:
      if name in c:
        out.update(_flat(c[name], f"{name}.") if isinstance(c[name], config_dict.ConfigDict)
                   else {name: c[name]})
    return {k: v for k, v in out.items() if k not in FREE}

  want, got = fixed(saved), fixed(config)
  # A model field absent from one of them is newer than that config: it had the default.
  default = {f"model.{k}": v for k, v in _model_defaults().items()}
  want, got = {**default, **want}, {**default, **got}
  for field in sorted(set(want) | set(got)):
    if want.get(field, "<absent>") != got.get(field, "<absent>"):
      raise ConfigError(
        f"{field}={got.get(field, '<absent>')!r} differs from {want.get(field, '<absent>')!r} "
        "in the workdir's config.json: the model and its data are the training run's; drop "
        "--config (the workdir's config is the default) or that override")


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
