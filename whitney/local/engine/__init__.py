"""The embedded server's torch engine: a Llama-style decoder with LoRA, the losses of losses.md,
AdamW, seeded sampling, checkpoints and PEFT export."""

from whitney.local.engine.errors import EngineError
from whitney.local.engine.runtime import BASE_MODELS, EngineRun, OpOutput

__all__ = ["BASE_MODELS", "EngineError", "EngineRun", "OpOutput"]
