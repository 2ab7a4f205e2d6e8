"""The RL flow: group sampling, rewards, advantages, a loss recipe, once per cycle."""
