"""The online RL algorithms by name: the one list the settings check, the config's
`algorithm` and the docs read. A new algorithm is a module beside these (a subclass of
`base.Algorithm`) and one line here."""

from __future__ import annotations

from helpsteer_jax.rl.algorithms.base import Algorithm
from helpsteer_jax.rl.algorithms.grpo import GRPO
from helpsteer_jax.rl.algorithms.ppo import PPO
from helpsteer_jax.rl.algorithms.rloo import RLOO

REGISTRY: dict[str, type[Algorithm]] = {cls.name: cls for cls in (RLOO, GRPO, PPO)}
