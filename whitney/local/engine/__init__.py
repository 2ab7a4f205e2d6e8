"""The embedded server's torch engine: a Llama-style decoder with LoRA, the losses of
docs/losses.md, AdamW, seeded sampling, checkpoints and PEFT export."""

from whitney.local.engine.runtime import BASE_MODELS, EngineRun, OpOutput
from whitney.local.engine.sampling import Step, Watch

SAMPLE_BATCH_INVARIANT = True
"""Consecutive sample operations may run as one engine call: their rows decode together and
each result is bitwise what it would be alone (see `exact`)."""

__all__ = ["BASE_MODELS", "EngineRun", "OpOutput", "SAMPLE_BATCH_INVARIANT", "Step", "Watch"]
