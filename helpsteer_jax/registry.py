"""A registry whose entries are imported when first asked for: name -> "module:attribute".

The model families and the RL algorithms are listed this way (as vLLM lists its model
classes), so that a run imports the family and the algorithm it uses, and a new one
costs the others nothing. An entry may also be the object itself (a test's, a user's).
"""

from __future__ import annotations

import importlib
from typing import Any, Iterator, MutableMapping


class LazyRegistry(MutableMapping[str, Any]):
  """name -> object; a "package.module:attribute" entry is imported on first access."""

  def __init__(self, entries: dict[str, Any]):
    self._entries = dict(entries)

  def __getitem__(self, name: str) -> Any:
    entry = self._entries[name]
    if isinstance(entry, str):
      module, _, attribute = entry.partition(":")
      entry = self._entries[name] = getattr(importlib.import_module(module), attribute)
    return entry

  def __setitem__(self, name: str, value: Any) -> None:
    self._entries[name] = value

  def __delitem__(self, name: str) -> None:
    del self._entries[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)
