"""The loop kit: the one outer loop and its cycles, each cycle's context and the calls it makes
around its middle, the start and end of a training run, budget and cost, the off-policy
schedule, plans built once per process and their seeds, stall windows."""
