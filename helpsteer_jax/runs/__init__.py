"""What the task entry points share: the preamble, summaries, the starting policy, the
iterated tasks' rounds, prompts, generation and preference-training helpers."""
