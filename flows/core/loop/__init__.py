"""The loop kit: the one outer loop and its cycles, the start and end of a training run, budget
and cost, the off-policy schedule, plans built once per process, seeds, stall windows."""
