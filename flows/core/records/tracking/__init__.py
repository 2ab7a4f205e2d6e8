"""Experiment trackers: a flow run sent to MLflow, TensorBoard and Weights & Biases.

config.py        the `tracking` setting of every flow config (no Prefect)
params.py        a config as params: flattened, nothing secret (no Prefect)
backend.py       the one interface of a backend, `Tracker`
mlflow_tracker.py, tensorboard_tracker.py, wandb_tracker.py   one backend each
lineage.py       the key that makes a retried or resumed flow run continue its tracked run
preflight.py     what a tracker would refuse or cannot reach, refused before anything starts
delivery.py      each tracker's calls on a thread of its own: retried, never failing the run
session.py       what the cycle kit and the flows' hooks call: `open_tracking`, `end_tracking`
"""
