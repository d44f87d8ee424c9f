"""Evaluate generations the way the papers do: MT-Bench answered and judged.

  # the AC-SFT export, graded by GPT-4 with FastChat's single-answer prompts
  export OPENAI_API_KEY=...
  helpsteer-jax --config=configs/evaluate_generation.py \
      --config.init.source=workdir/acsft/hf \
      --config.mt_bench.dir=FastChat/fastchat/llm_judge/data/mt_bench \
      --config.judge.base_url=https://api.openai.com/v1 --config.judge.model=gpt-4
  # any OpenAI-compatible judge (vLLM, SGLang, configs/serve.py)
  ... --config.judge.base_url=http://127.0.0.1:8001/v1 --config.judge.model=<served name>
  # the project's attribute model as judge: predicted attributes and reward per answer
  ... --config.judge.kind=attribute_model --config.scorer.source=workdir/attribute_model

`mt_bench.dir` is FastChat's `fastchat/llm_judge/data/mt_bench` (question.jsonl,
reference_answer/gpt-4.jsonl; judge_prompts.jsonl one level up), or a
directory with the three files side by side. Rerunning the same command
resumes: answers already written are kept and the judge is never asked the
same question twice (`judge_cache.jsonl`).

Presets: as configs/generate.py (default: the demo AC-SFT run's `tiny` model).
"""

import ml_collections

from helpsteer_jax.config_base import MODEL_RENAMED
from helpsteer_jax.config_sections import GENERATION_PRESETS, generation_config, scorer_section

PRESETS = GENERATION_PRESETS
RENAMED = {**MODEL_RENAMED, "judge.scorer": "scorer.source",
           "judge.batch_size": "scorer.batch_size", "judge.weights": "scorer.weights"}


def get_config(preset: str = ""):
  config = generation_config("evaluate_generation", preset)
  config.max_new_tokens = 1024 if preset not in ("", "demo") else 128  # FastChat: 1024
  config.model_id = ""  # the name in answers and judgments; "" = the workdir's name
  config.mt_bench = ml_collections.ConfigDict(dict(
      dir="", questions="", reference_answers="", judge_prompts="",
      question_ids=""))  # "" = all 80, else e.g. "81,101,111"
  # FastChat's per-category temperatures (0.7 writing/roleplay, 0.1 stem/humanities, else
  # greedy) instead of config.sampling.temperature.
  config.sampling.fastchat_temperatures = False
  config.judge = ml_collections.ConfigDict(dict(
      kind="openai",          # openai | attribute_model | none (answers only)
      base_url="",            # openai: the endpoint, e.g. https://api.openai.com/v1
      model="gpt-4",          # openai: the judge model's name at that endpoint
      api_key_env="OPENAI_API_KEY",  # the variable holding the endpoint's key
      max_retries=5,          # per request, exponential backoff (the openai client's)
      timeout=120.0,          # seconds per attempt
      parallel=4,             # requests in flight
      max_tokens=2048))
  # judge.kind=attribute_model: the attribute model (a workdir, HF reward dir or serve URL)
  # and the weights of its reward
  config.scorer = scorer_section(batch_size=8)
  return config
