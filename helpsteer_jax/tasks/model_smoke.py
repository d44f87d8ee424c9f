"""Model smoke test: build (or import) the model on the mesh, run a forward.

Prints the parameter count, a few parameter shardings, the hidden-state and
logit shapes and the model's top next tokens, and writes the same summary to
`<workdir>/model_smoke.json`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from helpsteer_jax import runtime
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.load import model as loader
from helpsteer_jax.models import builder
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  setup = setup_lib.prepare(config, workdir, model=False)
  rt, tok = setup.rt, setup.tokenizer
  sharding_lib.check_batch(config.batch_size, rt.mesh, rt.rules)
  model = loader.load_model(config, rt, loader.TRAIN)
  ids = tok(config.prompt).input_ids
  tokens = np.full((config.batch_size, len(ids)), tok.pad_token_id or 0, np.int32)
  tokens[:] = ids
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, tokens):
    m = nnx.merge(graphdef, state)
    hidden = m(tokens)
    return hidden, m.logits(hidden[:, -1:])

  batch_sharding = sharding_lib.named(rt.mesh, sharding_lib.batch_spec(rt.rules))
  with jax.set_mesh(rt.mesh), sharding_lib.axis_rules(rt.rules):
    hidden, logits = forward(state, jax.device_put(jnp.asarray(tokens), batch_sharding))
  top = np.argsort(-np.asarray(logits[0, -1]))[:5]
  params = {name: sharding_lib.describe_sharding(v[...])
            for name, v in builder.named_variables(nnx.state(model, nnx.Param)).items()}
  summary = {
      "model": runtime.model_config(config).hf_model_type,
      "num_params": builder.count_params(nnx.state(model, nnx.Param)),
      "mesh": dict(rt.mesh.shape),
      "prompt_tokens": len(ids),
      "hidden": sharding_lib.describe_sharding(hidden),
      "logits_last": sharding_lib.describe_sharding(logits),
      "top_next_tokens": [tok.decode([int(t)]) for t in top],
      "params": params,
  }
  summary_lib.write_summary(
      setup.workdir / "model_smoke.json", summary,
      f"parameters: {summary['num_params']:,}  mesh: {summary['mesh']}",
      *(f"  {name:40s} {desc}" for name, desc in list(params.items())[:8]),
      f"hidden: {summary['hidden']}\nlogits (last position): {summary['logits_last']}",
      f"top next tokens: {summary['top_next_tokens']}")
  return summary
