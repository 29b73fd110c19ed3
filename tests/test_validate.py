"""Config validation (transformer/training/validate.py): every field's value as a user might
type it ends in the config being accepted or in one ConfigError line naming the field, never a
traceback."""

import contextlib
import math
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ml_collections import config_dict

from configs import numbers as numbers_config
from configs import text as text_config
from configs import wmt as wmt_config
from tests.xla_flags import FAST_COMPILE
from transformer.errors import ConfigError
from transformer.training.validate import FIELDS, METHODS, validate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A field whose value is a mapping of its own (language -> path) is one leaf.
MAPPING_LEAVES = ("data.train_files", "data.eval_files", "data.test_files")
# Fields under a mapping of named entries, checked entry by entry (evaluators.check).
NAMED_ENTRIES = ("evals", "data.corpora")


def text_with_files() -> config_dict.ConfigDict:
  config = text_config.get_config("en-de")
  config.data.train_files.en = "corpus/train.en"
  config.data.train_files.de = "corpus/train.de"
  return config


CONFIGS: dict[str, Callable[[], config_dict.ConfigDict]] = {
  "numbers": numbers_config.get_config,
  "numbers-tiny": lambda: numbers_config.get_config("tiny"),
  "wmt-base": lambda: wmt_config.get_config("base"),
  "text": text_with_files,
}


def leaves(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
  """Dotted paths of the leaves of a config's `to_dict()` (a file mapping's entries too)."""
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}"


def mutated(config: config_dict.ConfigDict, changes: dict[str, Any]) -> config_dict.ConfigDict:
  """A copy of `config` with fields set to values of any type (as a config file may set them)."""
  tree = config.to_dict()
  for field, value in changes.items():
    *path, last = field.split(".")
    node = tree
    for part in path:
      node = node[part]
    node[last] = value
  return config_dict.ConfigDict(tree)


@contextlib.contextmanager
def changed(config: config_dict.ConfigDict, changes: dict[str, Any]) -> Iterator[None]:
  """`config` (built from plain values, no references) with fields set to values of any type
  for the block's duration: cheaper than a `mutated` copy per value."""
  saved = []
  for field, value in changes.items():
    *path, last = field.split(".")
    node = config
    for part in path:
      node = node[part]
    saved.append((node, last, node[last]))
    del node[last]  # a field keeps its type: a new one may take any
    node[last] = value
  try:
    yield
  finally:
    for node, last, value in reversed(saved):
      del node[last]
      node[last] = value


def typed_values(rng: random.Random) -> list[Any]:
  """What a user might type into any field: a wrong type, out of range, not a number, empty."""
  nonsense = "".join(rng.choice("abcXYZ019 -_/.:[]%~é") for _ in range(rng.randint(1, 12)))
  return [
    "7", [1, 2, 3], ["x"], {"a": 1}, True, False,
    -1, -rng.randint(2, 10**6), 0, 0.0, rng.random(), 10**12, rng.randint(2, 10**15),
    float("nan"), float("inf"), -float("inf"), 1e300,
    "", nonsense, "auto", None,
  ]


def assert_accepted_or_named(config: config_dict.ConfigDict, fields: list[str],
                             changes: dict[str, Any]) -> None:
  try:
    validate(config, 8)
  except ConfigError as e:
    message = str(e)
    assert "\n" not in message, f"{changes}: a message of several lines: {message!r}"
    assert any(f in message for f in fields), f"{changes}: {message!r} names none of {fields}"
  except Exception as e:  # noqa: BLE001 - anything else is the bug this test looks for
    pytest.fail(f"{changes}: {type(e).__name__}: {e}")


@pytest.mark.parametrize("name", CONFIGS)
def test_every_field_typed_wrong_is_accepted_or_one_line_naming_it(name):
  config = config_dict.ConfigDict(CONFIGS[name]().to_dict())
  validate(config, 8)
  rng = random.Random(f"validate-{name}")
  fields = list(leaves(config.to_dict()))
  for field in fields:
    for value in typed_values(rng):
      changes = {field: value}
      with changed(config, changes):
        assert_accepted_or_named(config, [field], changes)
  # A few fields at once: the message names one of them.
  for _ in range(300):
    chosen = rng.sample(fields, 3)
    changes = {f: rng.choice(typed_values(rng)) for f in chosen}
    with changed(config, changes):
      assert_accepted_or_named(config, chosen, changes)
  assert config.to_dict() == CONFIGS[name]().to_dict()  # every change was undone


@pytest.mark.parametrize("name", CONFIGS)
def test_every_field_of_the_configs_has_a_check(name):
  fields = {f for f in leaves(CONFIGS[name]().to_dict())
            if not f.startswith(tuple(f"{m}." for m in MAPPING_LEAVES + NAMED_ENTRIES))}
  assert fields - set(FIELDS) == set()


@pytest.mark.parametrize("path,arg", [("numbers", None), ("numbers", "tiny"), ("wmt", "base"),
                                      ("wmt", "big"), ("wmt", "tiny"), ("wmt", "fr_base"),
                                      ("wmt", "fr_big")])
def test_every_config_validates_on_one_and_on_eight_devices(path, arg):
  config = {"numbers": numbers_config, "wmt": wmt_config}[path].get_config(arg)
  for devices in (1, 8):
    assert validate(config, devices).vocab_size == config.data.vocab_size


def test_the_numbers_variants_are_the_tfds_builders_configs():
  from transformer.data import numbers, numbers_tfds

  assert set(numbers.VARIANTS) == set(numbers_tfds.NumbersTranslate.builder_configs)


# The failures seen before every field had its check: JAX errors, a 3.64 TiB numpy array, a
# FileNotFoundError, TFDS's name parsing.
@pytest.mark.parametrize("field,value", [
  ("decode.beam_size", 10**12),
  ("grad_accum_steps", 10**12),
  ("data.tokens_per_batch", 10**12),
  ("data.eval_batch_size", 10**12),
  ("data_dir", "/proc/nope"),
  ("dataset", "/proc/nope"),
])
def test_the_known_failures_are_one_line_naming_the_field(field, value):
  with pytest.raises(ConfigError, match=f"^{field}=") as e:
    validate(mutated(numbers_config.get_config("tiny"), {field: value}), 8)
  assert "\n" not in str(e.value)


def test_a_huge_beam_on_the_command_line_exits_2_with_one_line_and_writes_nothing(tmp_path):
  workdir = tmp_path / "w"
  proc = subprocess.run(
    [sys.executable, "-m", "transformer.main", "--config=configs/numbers.py:tiny",
     "--config.decode.beam_size=1000000000000", f"--workdir={workdir}"],
    cwd=REPO, env=dict(os.environ, XLA_FLAGS=FAST_COMPILE), capture_output=True, text=True,
    timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
  assert len(errors) == 1 and "decode.beam_size" in errors[0], proc.stderr[-2000:]
  assert not workdir.exists() or not os.listdir(workdir)


@pytest.mark.parametrize("field,good,bad", [
  ("decode.method", list(METHODS), ["Beam", "top_k", "", None, 1]),
  ("decode.temperature", [1, 0.7, 2.5], [0, -1.0, math.nan, math.inf, "1", True]),
  ("decode.top_k", [0, 1, 40, 256], [-1, 257, 4.0, True, None]),
  ("decode.top_p", [1, 1.0, 0.9, 1e-3], [0, 0.0, 1.01, -0.5, math.nan, "0.9"]),
  ("decode.seed", [0, 7, 2**32 - 1], [-1, 2**32, 1.5, False]),
  ("decode.tokens_per_batch", [1, 4096, 2**24], [0, -5, 2**24 + 1, 10**12, "4096"]),
  ("decode.chunk_size", [1, 10000], [0, 10**12, math.inf, None]),
  ("decode.beam_size", [1, 4, 256], [0, 257, True, 4.0]),
  ("decode.alpha", [0, 0.6, 1], [-0.1, math.nan, math.inf, "0.6"]),
  ("decode.max_extra_len", [0, 5], [-1, 10**12, None]),
  ("decode.batch_size", [1, 64], [0, True, 10**12]),
])
def test_decoding_fields(field, good, bad):
  config = numbers_config.get_config("tiny")  # vocabulary of 256
  for value in good:
    validate(mutated(config, {field: value}), 8)
  for value in bad:
    with pytest.raises(ConfigError, match=f"^{field}=") as e:
      validate(mutated(config, {field: value}), 8)
    assert "\n" not in str(e.value)


def test_configs_without_the_newer_decoding_fields_still_validate():
  config = numbers_config.get_config("tiny").to_dict()
  for field in ("method", "temperature", "top_k", "top_p", "seed", "tokens_per_batch",
                "chunk_size", "in_flight"):
    del config["decode"][field]
  validate(config_dict.ConfigDict(config), 8)


def test_a_workdir_config_saved_before_a_field_existed_takes_its_default(tmp_path):
  """`workdir.ADDED_FIELDS`: an older workdir's config.json gets the field (so that
  `--config.decode.in_flight=False` overrides it there too), and keeps a value it has."""
  from transformer import workdir as workdir_lib

  config = numbers_config.get_config("tiny")
  del config.decode["in_flight"]
  workdir_lib.save(config, tmp_path / "old")
  assert workdir_lib.load(tmp_path / "old").decode.in_flight is True
  with config.unlocked():
    config.decode.in_flight = False
  workdir_lib.save(config, tmp_path / "new")
  assert workdir_lib.load(tmp_path / "new").decode.in_flight is False


def test_configs_saved_before_evaluators_were_configured_still_validate():
  """A workdir's config.json from before `evals`, `best_checkpoint`, `early_stopping` and
  `init_from` existed: the default evaluators, no best checkpoint, no fine-tuning."""
  from transformer.training import evaluators

  config = numbers_config.get_config("tiny").to_dict()
  for field in ("evals", "best_checkpoint", "early_stopping", "init_from",
                "init_from_optimizer"):
    del config[field]
  config = config_dict.ConfigDict(config)
  validate(config, 8)
  assert evaluators.of_config(config).to_dict() == evaluators.default_evals().to_dict()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", ["label_smoothing", "optimizer.b1", "optimizer.eps",
                                   "optimizer.learning_rate_scale", "optimizer.grad_clip_norm",
                                   "model.dropout_rate", "decode.alpha"])
def test_numbers_must_be_finite(field, value):
  with pytest.raises(ConfigError, match=f"^{field}="):
    validate(mutated(numbers_config.get_config("tiny"), {field: value}), 8)


@pytest.mark.parametrize("field", ["seed", "data.vocab_size", "model.d_model", "mesh.fsdp",
                                   "num_train_steps", "grad_accum_steps"])
def test_booleans_are_not_integers(field):
  with pytest.raises(ConfigError, match=f"^{field}=True: must be"):
    validate(mutated(numbers_config.get_config("tiny"), {field: True}), 8)


@pytest.mark.parametrize("name", ["numbers", "wmt14", "text", "wmt14_translate/fr-en",
                                  "ted_hrlr_translate/pt_to_en", "para_crawl/ende",
                                  "wmt19_translate/de-en:1.0.0"])
def test_dataset_names_that_parse(name):
  config = text_with_files() if name == "text" else numbers_config.get_config("tiny")
  validate(mutated(config, {"dataset": name}), 8)


@pytest.mark.parametrize("name", ["/proc/nope", "wmt14/", "a/b/c", "wmt:1.0", "", "9lives",
                                  "wmt14_translate/de en"])
def test_dataset_names_that_do_not_parse(name):
  with pytest.raises(ConfigError, match="^dataset=.*TFDS builder name"):
    validate(mutated(numbers_config.get_config("tiny"), {"dataset": name}), 8)


@pytest.mark.parametrize("split,ok", [
  ("train", True), ("train[:10%]", True), ("train[5000:]", True), ("train[100:200]", True),
  ("train[:50]+validation", True), ("train[-10%:]", True), ("train[", False), ("train[:]", False),
  ("train[a:b]", False), ("", False), ("train + ", False),
])
def test_split_strings(split, ok):
  config = mutated(numbers_config.get_config("tiny"), {"data.eval_split": split})
  if ok:
    validate(config, 8)
  else:
    with pytest.raises(ConfigError, match="^data.eval_split="):
      validate(config, 8)


def test_directories_exist_or_can_be_created(tmp_path):
  config = numbers_config.get_config("tiny")
  (tmp_path / "file").write_text("x")
  for field in ("data_dir", "data.cache_dir"):
    for path in (tmp_path, tmp_path / "new" / "deeper", "", None, "gs://bucket/dir"):
      validate(mutated(config, {field: path if path in ("", None) else str(path)}), 8)
    for path, why in ((tmp_path / "file", "not a directory"),
                      (tmp_path / "file" / "below", "not a directory"),
                      ("/proc/nope", "cannot create it")):
      with pytest.raises(ConfigError, match=f"^{field}=.*{why}"):
        validate(mutated(config, {field: str(path)}), 8)
  assert sorted(os.listdir(tmp_path)) == ["file"]  # the probes left nothing behind


def test_grad_accum_steps_leave_every_micro_batch_a_row():
  config = numbers_config.get_config("tiny")  # 512 tokens, rows of up to 64: 8 rows
  validate(mutated(config, {"grad_accum_steps": 8}), 8)
  with pytest.raises(ConfigError, match="^grad_accum_steps=9: must be <= 8"):
    validate(mutated(config, {"grad_accum_steps": 9}), 8)


def test_sizes_within_a_devices_memory():
  config = wmt_config.get_config("big")
  validate(config, 1)
  huge = mutated(config, {"data.vocab_size": 2**20, "model.vocab_size": 2**20,
                          "data.tokens_per_batch": 2**24})
  with pytest.raises(ConfigError, match="model.vocab_size=1048576.*GiB a device"):
    validate(huge, 1)
  with pytest.raises(ConfigError, match="decode.batch_size=.*tokens of decoder state"):
    validate(mutated(config, {"decode.batch_size": 2**16}), 8)
