"""The SFT flow: (prompt, completion) pairs trained with cross_entropy at a scheduled rate."""
