"""The reliability suite: the real daemon under injected faults, counted (``python -m reliability``).

Scenarios live in :mod:`reliability.scenarios`; :mod:`reliability.workspace` builds each one's world
(folder, config, database, supervised daemon, webhook receiver), :mod:`reliability.figures` counts what
came out, and RELIABILITY.md records a full run's figures with the command that produced them.
"""
