"""Training engine shared by every task that trains.

`Trainer` (loop.py) runs a task's `loss_fn(model, batch)` with the jitted,
sharded, accumulating step, evaluation, logging and checkpoints;
`trainer_step_spec` (abstract_step.py) is the same step on abstract inputs
for compile-only runs; `reference_logps` is 2D-DPO's cached reference pass.
"""
