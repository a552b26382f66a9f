"""Deciding what to evaluate and when.

The frequency policy, adaptive and staged evaluation, timers and resource checks.
"""
