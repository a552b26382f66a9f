"""Watching the checkpoint folders.

File events and polling, discovery of new checkpoints and the readiness verdict.
"""
