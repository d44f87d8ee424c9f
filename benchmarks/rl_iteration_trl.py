"""The TRL side of benchmarks/rl_iteration.py (run by the TRL environment's python).

  <trl-python> benchmarks/rl_iteration_trl.py make-model SPEC.json OUT_DIR
  <trl-python> benchmarks/rl_iteration_trl.py run SPEC.json RESULT.json

`make-model` saves a random LlamaForCausalLM of the spec's shape (seed 0) with
transformers' `save_pretrained`: the weights both sides start from.
`run` trains `GRPOTrainer` (GRPO, GSPO, DAPO) or `RLOOTrainer` (PyTorch, CPU, fp32) for one
warm-up and `iterations` timed steps, one rollout of P x K completions and one
optimizer step each, and writes per-step seconds (the step from a
TrainerCallback's on_step_begin to on_step_end; the generation inside it from
a wrapper around `_generate`; the rest of `_generate_and_score_completions`:
rewards, reference log-probs), tokens and the peak RSS. Imports neither jax
nor helpsteer_jax.
"""

from __future__ import annotations

import json
import pathlib
import resource
import sys
import tempfile
import time


def make_model(spec: dict, out: str) -> None:
  import torch
  import transformers
  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(**spec["hf_config"])
  transformers.LlamaForCausalLM(cfg).save_pretrained(out)


def run(spec: dict, result_path: str) -> None:
  import datasets
  import torch
  import transformers
  import trl

  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
  import rl_reward

  torch.manual_seed(0)
  p, k, t, algorithm = spec["prompts"], spec["k"], spec["max_new_tokens"], spec["algorithm"]
  steps = 1 + spec["iterations"]
  tokenizer = transformers.AutoTokenizer.from_pretrained(spec["hf_dir"])
  # The prompts as raw text (no chat template); their ids must be ours, BOS included.
  ids = tokenizer(text=spec["prompt_texts"])["input_ids"]
  if [list(x) for x in ids] != spec["prompt_ids"]:
    raise SystemExit("TRL's prompt ids differ from ours")
  model = transformers.AutoModelForCausalLM.from_pretrained(
      spec["hf_dir"], dtype=torch.float32, attn_implementation="sdpa")
  common_args = dict(
      output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, fp16=False,
      gradient_checkpointing=False, per_device_train_batch_size=p * k,
      gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
      num_generations=k, max_completion_length=t, temperature=spec["temperature"],
      top_p=1.0, top_k=0, max_steps=steps, learning_rate=spec["lr"],
      lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=spec["b1"],
      adam_beta2=spec["b2"], adam_epsilon=spec["eps"], max_grad_norm=spec["grad_clip"],
      shuffle_dataset=False, disable_dropout=True, report_to="none", logging_strategy="no",
      save_strategy="no", seed=0, dataloader_num_workers=0,
      # EOS never ends a completion: every one is max_completion_length tokens.
      generation_kwargs={"min_new_tokens": t})
  if algorithm == "grpo":
    args = trl.GRPOConfig(beta=spec["beta"], loss_type="grpo", scale_rewards="group",
                          epsilon=spec["eps_clip"], **common_args)
    trainer_cls = trl.GRPOTrainer
  elif algorithm == "gspo":  # the GSPO paper's settings, as TRL's paper index gives them
    args = trl.GRPOConfig(beta=0.0, loss_type="grpo", scale_rewards="group",
                          importance_sampling_level="sequence", epsilon=3e-4,
                          epsilon_high=4e-4, **common_args)
    trainer_cls = trl.GRPOTrainer
  elif algorithm == "dapo":  # clip-higher and the token-level loss; no dynamic sampling
    args = trl.GRPOConfig(beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=0.2,
                          epsilon_high=0.28, **common_args)
    trainer_cls = trl.GRPOTrainer
  else:
    args = trl.RLOOConfig(beta=spec["kl_coef"], normalize_advantages=False,
                          epsilon=spec["eps_clip"], **common_args)
    trainer_cls = trl.RLOOTrainer
  dataset = datasets.Dataset.from_dict({"prompt": spec["prompt_texts"]})

  steps_log: list[dict] = []
  current: dict = {}

  class Timer(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
      current.clear()
      current.update(start=time.perf_counter(), generate_s=0.0, experience_s=0.0)

    def on_step_end(self, args, state, control, **kwargs):
      current["step_s"] = time.perf_counter() - current.pop("start")
      steps_log.append(dict(current))

  trainer = trainer_cls(model=model, reward_funcs=rl_reward.trl_reward, args=args,
                        train_dataset=dataset, processing_class=tokenizer, callbacks=[Timer()])

  generate, experience = trainer._generate, trainer._generate_and_score_completions

  def timed_generate(*a, **kw):
    start = time.perf_counter()
    out = generate(*a, **kw)
    current["generate_s"] += time.perf_counter() - start
    return out

  def timed_experience(*a, **kw):
    start = time.perf_counter()
    out = experience(*a, **kw)
    current["experience_s"] += time.perf_counter() - start
    mask = out["completion_mask"]
    current["completion_tokens"] = int(mask.sum())
    current["completion_lengths"] = sorted(set(mask.sum(-1).tolist()))
    current["prompt_tokens"] = int(out["prompt_mask"].sum())
    current["padded_prompt_len"] = int(out["prompt_ids"].shape[1])
    current["rows"] = int(mask.shape[0])
    return out

  trainer._generate = timed_generate
  trainer._generate_and_score_completions = timed_experience
  trainer.train()
  peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  result = {"steps": steps_log, "peak_rss_mb": round(peak_mb, 1),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "trl": trl.__version__, "torch_threads": torch.get_num_threads()}
  pathlib.Path(result_path).write_text(json.dumps(result, indent=2))


def main() -> None:
  mode, spec_path, out = sys.argv[1:4]
  spec = json.loads(pathlib.Path(spec_path).read_text())
  if mode == "make-model":
    make_model(spec, out)
  elif mode == "run":
    run(spec, out)
  else:
    raise SystemExit(f"unknown mode {mode!r}: make-model or run")


if __name__ == "__main__":
  main()
