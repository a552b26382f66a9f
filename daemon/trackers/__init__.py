"""Trackers: results delivered to MLflow, W&B and TensorBoard through the outbox (see config.py)."""
