"""safetensors files (Hugging Face's weight format), read and written with NumPy alone.

The format: an 8-byte little-endian unsigned integer N, then N bytes of a JSON header that maps
each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]} (and may hold a
"__metadata__" entry of strings), then the tensors' raw little-endian bytes; offsets count from
the end of the header. Nothing in the file is executed (unlike a pickled `pytorch_model.bin`).
"""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np

from transformer import storage
from transformer.errors import UserError

# safetensors dtype names -> NumPy dtypes (little-endian).
DTYPES: dict[str, np.dtype] = {
  "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
  "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
METADATA = "__metadata__"


def read(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Every tensor of the safetensors file `path` (local or remote), by name.

  The arrays are read-only views of the file's bytes, in the file's dtypes.

  Raises:
    UserError: one line naming the file, when it is missing, cut short or not safetensors.
  """
  return read_with_metadata(path)[0]


def read_with_metadata(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """`read`'s tensors and the file's string metadata ({} if it has none)."""
  try:
    data = storage.as_path(path).read_bytes()
  except FileNotFoundError:
    raise UserError(f"{path} not found") from None
  if len(data) < 8:
    raise UserError(f"{path}: not a safetensors file ({len(data)} bytes)")
  (length,) = struct.unpack("<Q", data[:8])
  if 8 + length > len(data):
    raise UserError(f"{path}: not a safetensors file, or cut short (a header of {length:,} "
                    f"bytes in {len(data):,})")
  try:
    header = json.loads(data[8 : 8 + length])
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"{path}: the safetensors header is not JSON ({e})") from None
  if not isinstance(header, dict):
    raise UserError(f"{path}: the safetensors header is not a JSON object")
  body = memoryview(data)[8 + length :]
  tensors = {}
  for name, entry in header.items():
    if name == METADATA:
      continue
    tensors[name] = _tensor(body, name, entry, path)
  metadata = header.get(METADATA) or {}
  if not isinstance(metadata, dict):
    raise UserError(f"{path}: the safetensors {METADATA} entry is not a JSON object")
  return tensors, metadata


def _tensor(body: memoryview, name: str, entry: object, path: str | os.PathLike) -> np.ndarray:
  try:
    dtype = DTYPES[entry["dtype"]]
    shape = tuple(int(n) for n in entry["shape"])
    begin, end = (int(n) for n in entry["data_offsets"])
  except (TypeError, KeyError, ValueError):
    known = ", ".join(DTYPES)
    raise UserError(f"{path}: tensor {name!r} has a bad header entry {entry!r} (dtypes read "
                    f"here: {known})") from None
  size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if not 0 <= begin <= end <= len(body) or end - begin != size:
    raise UserError(f"{path}: tensor {name!r} has offsets {begin}..{end} for {size:,} bytes "
                    f"in a body of {len(body):,}: the file is damaged or cut short")
  return np.frombuffer(body[begin:end], dtype=dtype).reshape(shape)


NAMES = {dtype: name for name, dtype in DTYPES.items()}


def write(path: str | os.PathLike, tensors: dict[str, np.ndarray],
          metadata: dict[str, str] | None = None) -> None:
  """Writes `tensors` (by name, in sorted order, as `safetensors.numpy.save_file` lays them
  out) with optional string `metadata`, atomically."""
  header: dict[str, object] = {}
  if metadata:
    header[METADATA] = dict(metadata)
  chunks, offset = [], 0
  for name in sorted(tensors):
    array = np.ascontiguousarray(tensors[name])
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    if dtype not in NAMES:
      raise ValueError(f"tensor {name!r}: dtype {array.dtype} has no safetensors name")
    data = array.astype(dtype, copy=False).tobytes()
    header[name] = {"dtype": NAMES[dtype], "shape": list(array.shape),
                    "data_offsets": [offset, offset + len(data)]}
    chunks.append(data)
    offset += len(data)
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)  # the body starts 8-byte aligned, as the library writes it
  storage.write_atomic(path, struct.pack("<Q", len(text)) + text + b"".join(chunks))
