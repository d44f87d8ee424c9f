"""Training engine shared by every task that trains.

`Trainer` (loop.py) runs a task's `loss_fn(model, batch)` with the jitted,
sharded, accumulating step, evaluation, logging and checkpoints;
`trainer_step_spec` (abstract_step.py) is the same step on abstract inputs
for compile-only runs; `reference_logps` is 2D-DPO's cached reference pass.
"""

from helpsteer_jax.train.abstract_step import StepSpec, trainer_step_spec
from helpsteer_jax.train.checkpoint import Checkpointer
from helpsteer_jax.train.loop import LossFn, RunResult, Trainer, pipeline_config, train_config
from helpsteer_jax.train.optim import make_optimizer, optimizer_config
from helpsteer_jax.train.reference import reference_logps
from helpsteer_jax.train.state import ModelParts, TrainState, merge_model, split_model

__all__ = [
    "Checkpointer", "LossFn", "ModelParts", "RunResult", "StepSpec", "TrainState", "Trainer",
    "make_optimizer", "merge_model", "optimizer_config", "pipeline_config", "reference_logps",
    "split_model", "train_config", "trainer_step_spec",
]
