"""What happens to a checkpoint after training, off the critical path: the evaluate-checkpoint
flow (`evaluate`, started by a deployment trigger for every checkpoint a run saves) and the
promote-checkpoint flow (`promote`, a person approves in the Prefect UI before the model is
exported). Both evaluate on frozen runs created from checkpoints (`frozen`)."""
