"""The distillation flow: an SFT-trained teacher scores a student's samples (reverse KL)."""
