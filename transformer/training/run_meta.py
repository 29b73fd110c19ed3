"""What a checkpoint must agree on with the run that restores it: the model's fields, the
vocabulary and the optional parts of the train state, as `run_meta` records them in every
checkpoint's `meta` item (transformer/training/checkpoint.py) and `check_meta` compares them.
Apart from the checkpointer, so that checking a run against its checkpoints (or keying restored
parameters by it: transformer/training/parameter_cache.py) imports no Orbax.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from transformer.errors import CheckpointError
from transformer.nn.model import ModelConfig
from transformer.training.train_state import STATE_PARTS, optimizer_value


def run_meta(config: Any, model_config: ModelConfig, vocab_sha256: str) -> dict[str, Any]:
  """What a checkpoint must agree on with the run that restores it (`vocab_sha256`: the
  vocabulary file's hash, `Tokenizer.sha256`)."""
  model = dataclasses.asdict(model_config)
  return {"model": model, "vocab_sha256": vocab_sha256, "config": json.loads(config.to_json())}


# Fields that may differ between a checkpoint and the run restoring it: they change how the
# computation is done, not the parameters.
COMPATIBLE_FIELDS = ("dtype", "attention", "attention_chunk_size", "remat", "dropout_rate",
                      "attention_dropout_rate", "dropout_mask_bits")


def check_meta(expected: dict[str, Any], parts: tuple[str, ...] | None = None):
  """`check(meta, path)`: raises CheckpointError if the checkpoint's vocabulary or model
  differs from `expected` (`run_meta`), or if one of the train state's optional `parts`
  (default: all of `train_state.STATE_PARTS`) is on in one and off in the other."""
  parts = STATE_PARTS if parts is None else parts

  def check(meta: dict[str, Any], path: str) -> None:
    if meta.get("vocab_sha256") != expected["vocab_sha256"]:
      raise CheckpointError(
        f"checkpoint {path} was trained with another vocabulary than the workdir's; "
        "use a new --workdir"
      )
    old, new = meta.get("model", {}), expected["model"]
    # A field that a checkpoint's metadata lacks is newer than the checkpoint: it had the
    # default (the paper's choice).
    default = dataclasses.asdict(ModelConfig())
    for field in sorted(set(old) | set(new)):
      if field in COMPATIBLE_FIELDS:
        continue
      if old.get(field, default.get(field)) != new.get(field, default.get(field)):
        raise CheckpointError(
          f"checkpoint {path} has model.{field}={old.get(field)!r} but the config has "
          f"{new.get(field)!r}; use a new --workdir or the checkpoint's config"
        )
    if "config" in meta:
      # Clipping, weight decay and the average each add a part to the train state: turned on
      # or off, the state has another tree, which the checkpoint cannot restore into.
      for name in parts:
        saved = optimizer_value(meta["config"], name)
        wanted = optimizer_value(expected["config"], name)
        if (saved > 0) != (wanted > 0):
          on = lambda v: "on" if v > 0 else "off"  # noqa: E731
          raise CheckpointError(
            f"checkpoint {path} has optimizer.{name}={saved!r} ({on(saved)}) but the config "
            f"has {wanted!r} ({on(wanted)}): it restores only with optimizer.{name} "
            f"{on(saved)}; change that or use a new --workdir"
          )

  return check
