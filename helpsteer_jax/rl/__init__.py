"""Online RL with the attribute model as the reward: rollouts, advantages, updates."""
