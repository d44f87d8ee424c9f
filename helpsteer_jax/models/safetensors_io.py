"""Lazy reading and streaming writing of the safetensors file format.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
header length N, N bytes of JSON mapping tensor names to
`{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the
byte buffer after the header) plus an optional `__metadata__` string map,
then the raw little-endian, C-ordered tensor bytes. `safetensors.safe_open`
with `framework="numpy"` cannot return bfloat16, so this module parses the
format itself: tensors are `np.memmap` views and are read from disk only when
touched, and files are written one tensor at a time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from typing import Callable, Mapping, Sequence

import ml_dtypes
import numpy as np

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class SafetensorsError(ValueError):
  """A malformed or incomplete safetensors checkpoint."""


def dtype_name(dtype: np.dtype | str) -> str:
  """The safetensors dtype string (e.g. `BF16`) of a numpy dtype."""
  dtype = np.dtype(dtype)
  if dtype not in _NAMES:
    raise SafetensorsError(f"dtype {dtype} has no safetensors equivalent")
  return _NAMES[dtype]


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  name: str
  dtype: np.dtype
  shape: tuple[int, ...]
  begin: int
  end: int


class SafetensorsFile:
  """One `.safetensors` file, memory-mapped; tensors are lazy views."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    size = os.path.getsize(self.path)
    with open(self.path, "rb") as f:
      raw = f.read(8)
      if len(raw) != 8:
        raise SafetensorsError(f"{self.path}: too short for a safetensors file")
      (n,) = struct.unpack("<Q", raw)
      if n > size - 8:
        raise SafetensorsError(f"{self.path}: header length {n} exceeds the file")
      try:
        header = json.loads(f.read(n))
      except json.JSONDecodeError as e:
        raise SafetensorsError(f"{self.path}: unreadable header: {e}") from e
    self.data_start = 8 + n
    self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
    self.tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
      if entry["dtype"] not in _DTYPES:
        raise SafetensorsError(
            f"{self.path}: tensor {name!r} has unsupported dtype {entry['dtype']}")
      dtype = _DTYPES[entry["dtype"]]
      shape = tuple(int(s) for s in entry["shape"])
      begin, end = (int(o) for o in entry["data_offsets"])
      if end - begin != math.prod(shape) * dtype.itemsize or (
          self.data_start + end > size):
        raise SafetensorsError(
            f"{self.path}: tensor {name!r} offsets {begin}:{end} do not match"
            f" its shape {shape} / dtype {entry['dtype']} or the file size")
      self.tensors[name] = TensorInfo(name, dtype, shape, begin, end)
    self._mmap: np.memmap | None = None

  def keys(self) -> list[str]:
    return list(self.tensors)

  def get(self, name: str) -> np.ndarray:
    """A read-only, lazily loaded view of tensor `name`."""
    info = self.tensors[name]
    if info.end == info.begin:
      return np.zeros(info.shape, info.dtype)
    if self._mmap is None:
      self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
    buf = self._mmap[self.data_start + info.begin:self.data_start + info.end]
    return buf.view(info.dtype).reshape(info.shape)


class CheckpointReader:
  """The tensors of a HF checkpoint directory: one file or an index of shards."""

  def __init__(self, directory: str | os.PathLike):
    self.directory = os.fspath(directory)
    index = os.path.join(self.directory, INDEX_FILE)
    single = os.path.join(self.directory, SINGLE_FILE)
    if os.path.exists(index):
      with open(index) as f:
        weight_map: Mapping[str, str] = json.load(f)["weight_map"]
      self.source = index
    elif os.path.exists(single):
      weight_map = {n: SINGLE_FILE for n in SafetensorsFile(single).keys()}
      self.source = single
    else:
      raise FileNotFoundError(
          f"No {SINGLE_FILE} or {INDEX_FILE} in {self.directory}"
          " (only safetensors checkpoints are supported)")
    self.weight_map = dict(weight_map)
    self._files: dict[str, SafetensorsFile] = {}

  def names(self) -> list[str]:
    return list(self.weight_map)

  def __contains__(self, name: str) -> bool:
    return name in self.weight_map

  def file_of(self, name: str) -> str:
    return os.path.join(self.directory, self.weight_map[name])

  def _file(self, name: str) -> SafetensorsFile:
    fname = self.weight_map[name]
    if fname not in self._files:
      self._files[fname] = SafetensorsFile(os.path.join(self.directory, fname))
    file = self._files[fname]
    if name not in file.tensors:
      raise SafetensorsError(
          f"tensor {name!r} is listed in {self.source} but missing from"
          f" {file.path}")
    return file

  def info(self, name: str) -> TensorInfo:
    return self._file(name).tensors[name]

  def get(self, name: str) -> np.ndarray:
    return self._file(name).get(name)


# ---------------------------------------------------------------------------
# Writing.


@dataclasses.dataclass(frozen=True)
class TensorPlan:
  """A tensor to write: its name, shape and on-disk dtype."""

  name: str
  shape: tuple[int, ...]
  dtype: np.dtype

  @property
  def nbytes(self) -> int:
    return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def plan_shards(tensors: Sequence[TensorPlan],
                max_shard_bytes: int) -> list[list[TensorPlan]]:
  """Splits tensors, in order, into files of at most `max_shard_bytes`.

  A single tensor larger than the limit gets a file of its own.
  """
  shards: list[list[TensorPlan]] = [[]]
  size = 0
  for t in tensors:
    if shards[-1] and size + t.nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(t)
    size += t.nbytes
  return shards


def shard_file_names(num_shards: int) -> list[str]:
  if num_shards == 1:
    return [SINGLE_FILE]
  return [f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
          for i in range(num_shards)]


def _header_bytes(tensors: Sequence[TensorPlan], metadata: Mapping[str, str]) -> bytes:
  header: dict[str, object] = {"__metadata__": dict(metadata)}
  offset = 0
  for t in tensors:
    header[t.name] = {"dtype": dtype_name(t.dtype), "shape": list(t.shape),
                      "data_offsets": [offset, offset + t.nbytes]}
    offset += t.nbytes
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)  # align the data to 8 bytes, as HF does
  return struct.pack("<Q", len(raw)) + raw


def write_file(path: str | os.PathLike, tensors: Sequence[TensorPlan],
               produce: Callable[[TensorPlan], np.ndarray],
               metadata: Mapping[str, str] | None = None,
               write: bool = True) -> None:
  """Writes the header, then each tensor's bytes as `produce` returns them.

  `produce(plan)` is called once per tensor, in order, so at most one tensor
  is held in host memory. With `write=False` (the non-writing processes of a
  multi-host run, which must still join the collective gathers) `produce`
  is still called but nothing is written.
  """
  metadata = {"format": "pt", **(metadata or {})}
  f = open(path, "wb") if write else None
  try:
    if f is not None:
      f.write(_header_bytes(tensors, metadata))
    for t in tensors:
      arr = np.ascontiguousarray(produce(t), dtype=t.dtype)
      if arr.shape != t.shape:
        raise SafetensorsError(
            f"tensor {t.name!r}: produced shape {arr.shape}, planned {t.shape}")
      if f is not None:
        f.write(arr.reshape(-1).view(np.uint8).data)
  finally:
    if f is not None:
      f.close()


def write_index(directory: str | os.PathLike,
                shards: Sequence[Sequence[TensorPlan]],
                names: Sequence[str]) -> None:
  """Writes `model.safetensors.index.json` for sharded output."""
  weight_map = {t.name: fname for fname, shard in zip(names, shards) for t in shard}
  total = sum(t.nbytes for shard in shards for t in shard)
  params = sum(math.prod(t.shape) for shard in shards for t in shard)
  index = {"metadata": {"total_parameters": params, "total_size": total},
           "weight_map": dict(sorted(weight_map.items()))}
  with open(os.path.join(directory, INDEX_FILE), "w") as f:
    json.dump(index, f, indent=2)
    f.write("\n")
