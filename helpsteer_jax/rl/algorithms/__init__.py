"""The online RL algorithms by name: the one list the settings check, the config's
`algorithm` and the docs read. A new algorithm is a module beside these (a subclass of
`base.Algorithm`) and one line here; its module is imported when first asked for."""

from __future__ import annotations

from typing import MutableMapping

from helpsteer_jax.registry import LazyRegistry
from helpsteer_jax.rl.algorithms.base import Algorithm

REGISTRY: MutableMapping[str, type[Algorithm]] = LazyRegistry({
    "rloo": f"{__name__}.rloo:RLOO",
    "grpo": f"{__name__}.grpo:GRPO",
    "ppo": f"{__name__}.ppo:PPO",
    "gspo": f"{__name__}.gspo:GSPO",
    "dapo": f"{__name__}.dapo:DAPO",
    "distill": f"{__name__}.distill:Distill",
})
