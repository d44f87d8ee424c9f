"""Reading and streaming writing of the safetensors file format.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
header length N, N bytes of JSON mapping tensor names to
`{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the
byte buffer after the header) plus an optional `__metadata__` string map,
then the raw little-endian, C-ordered tensor bytes.

Reading goes through `safetensors.safe_open(path, framework="numpy")`, which
serves every dtype of the HF checkpoints we import (bfloat16 as an
`ml_dtypes` array), and its `get_slice`, which copies only the requested
block of a tensor out of the memory-mapped file. Writing streams one tensor
at a time.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import struct
from typing import Callable, Mapping, Sequence

import ml_dtypes
import numpy as np
import safetensors

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
# safetensors 0.8 looks float8 types up as numpy attributes, which fail.
_UNREADABLE = ("F8_E4M3", "F8_E5M2")

Index = tuple[slice, ...]


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

  @property
  def nbytes(self) -> int:
    return math.prod(self.shape) * self.dtype.itemsize


class SafetensorsFile:
  """One `.safetensors` file; tensors (or blocks of them) are read on demand.

  The file is memory-mapped only while a read runs, so the pages a read
  touched do not stay in this process's resident set.
  """

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    with self._open() as f:
      self.metadata: dict[str, str] = f.metadata() or {}
      self.tensors: dict[str, TensorInfo] = {}
      for name in f.keys():
        block = f.get_slice(name)
        dtype = block.get_dtype()
        if dtype not in _DTYPES or dtype in _UNREADABLE:
          raise SafetensorsError(
              f"{self.path}: tensor {name!r} has unsupported dtype {dtype}")
        self.tensors[name] = TensorInfo(name, _DTYPES[dtype], tuple(block.get_shape()))

  def _open(self):
    try:
      return safetensors.safe_open(self.path, framework="numpy")
    except safetensors.SafetensorError as e:
      raise SafetensorsError(f"{self.path}: not a readable safetensors file ({e})") from None
    except FileNotFoundError:
      raise SafetensorsError(f"{self.path}: file not found") from None

  def keys(self) -> list[str]:
    return list(self.tensors)

  def get(self, name: str, index: Index | None = None) -> np.ndarray:
    """Tensor `name`, or only its block `index` (a tuple of slices)."""
    info = self.tensors[name]
    # A zero-stride view gives the block's shape (and checks the index).
    shape = np.broadcast_to(np.zeros((), info.dtype), info.shape)[index or ()].shape
    if 0 in shape:  # the library refuses to slice empty tensors
      return np.zeros(shape, info.dtype)
    with self._open() as f:
      return f.get_slice(name)[index or ...]


class CheckpointReader:
  """The tensors of a HF checkpoint directory: one file or an index of shards.

  `bytes_read` counts the bytes of every tensor or block served, in total
  and per tensor (`bytes_by_tensor`), so a process can tell what it read.
  """

  def __init__(self, directory: str | os.PathLike):
    self.directory = os.fspath(directory)
    index = os.path.join(self.directory, INDEX_FILE)
    single = os.path.join(self.directory, SINGLE_FILE)
    self._files: dict[str, SafetensorsFile] = {}
    if os.path.exists(index):
      with open(index) as f:
        weight_map: Mapping[str, str] = json.load(f)["weight_map"]
      self.source = index
    elif os.path.exists(single):
      self._files[SINGLE_FILE] = SafetensorsFile(single)
      weight_map = {n: SINGLE_FILE for n in self._files[SINGLE_FILE].keys()}
      self.source = single
    else:
      raise FileNotFoundError(
          f"No {SINGLE_FILE} or {INDEX_FILE} in {self.directory}"
          " (only safetensors checkpoints are supported)")
    self.weight_map = dict(weight_map)
    self.bytes_read = 0
    self.bytes_by_tensor: collections.Counter[str] = collections.Counter()

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

  def get(self, name: str, index: Index | None = None) -> np.ndarray:
    """Tensor `name`, or only its block `index` (a tuple of slices)."""
    out = self._file(name).get(name, index)
    self.bytes_read += out.nbytes
    self.bytes_by_tensor[name] += out.nbytes
    return out


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
