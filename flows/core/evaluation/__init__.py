"""Evaluation of a run's weights on a sampler of their own: the settings (`config`), the eval
set and its numbers (`plan`, no Prefect), and the ordered calls that sample it (`sampler`).

The same settings and seeds evaluate the weights inline (RL and distillation, every
`eval_every` cycles) and off the critical path (the evaluate-checkpoint and
promote-checkpoint flows, on a frozen run created from a checkpoint), so equal weights give
equal numbers wherever they are evaluated.
"""
