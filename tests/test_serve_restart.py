"""A restarted server reads its warm-up's programs from the compilation cache in its workdir.

The serve tests' tiny server (policy and attribute model, one CPU device)
started, stopped and started again on the same workdir: the first warm-up
compiles every program and reads none; the second reads every program it
compiles from `<workdir>/compile_cache` (JAX's monitoring events, in `/stats`
and the warm-up line) and answers the same greedy chat.
"""

import re

from serve_utils import Server

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Name a colour"}],
        "max_tokens": 8, "temperature": 0}


# Short rows and scorer inputs: fewer buckets to warm up twice, the same mechanism.
SHORT = ("--config.serve.max_length=128", "--config.serve.max_tokens=64",
         "--config.scorer.max_len=64")


def _start(models, root) -> tuple[dict, str, str]:
  server = Server(models, root, *SHORT)
  try:
    stats = server.stats()
    reply = server.post("chat/completions", CHAT)
    assert reply.status_code == 200, reply.text
    log = (root / "server.log").read_text()
    line = next(x for x in log.splitlines() if "warmed up in" in x)
    return stats, line, reply.json()["choices"][0]["message"]["content"]
  finally:
    server.stop()


def test_a_restart_reads_every_program_from_the_cache(served_models, tmp_path):
  first, first_line, first_text = _start(served_models, tmp_path)
  assert first["compiles"] > 0 and first["compile_cache_hits"] == 0, first
  cache = tmp_path / "workdir" / "compile_cache"
  assert len(list(cache.iterdir())) >= first["compiles"]
  second, second_line, second_text = _start(served_models, tmp_path)
  assert second["compile_cache_hits"] == second["compiles"] == first["compiles"], second
  hits = re.search(r"\((\d+) compiles, (\d+) of them read from the compilation cache", second_line)
  assert hits and hits[1] == hits[2] == str(first["compiles"]), second_line
  assert second_text == first_text
