"""The online RL algorithms by name: `choices.RL_ALGORITHMS`, the one list the settings
check, the config's `algorithm`, `--help` and the docs read. A new algorithm is a module
beside these (a subclass of `base.Algorithm`) and one line in that table; its module is
imported when first asked for."""

from __future__ import annotations

from typing import MutableMapping

from helpsteer_jax import choices
from helpsteer_jax.registry import LazyRegistry
from helpsteer_jax.rl.algorithms.base import Algorithm

REGISTRY: MutableMapping[str, type[Algorithm]] = LazyRegistry(choices.RL_ALGORITHMS)
