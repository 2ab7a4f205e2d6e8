"""The DPO flow: preference pairs through the importance-sampling gradient."""
