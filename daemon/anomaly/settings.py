"""Detector settings: defaults tuned on the labelled synthetic benchmark (``bench.detector_quality``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    #: Points before the newest that make its baseline (rolling median, MAD).
    window: int = 8
    #: Points a series needs before any relative rule speaks (the warm-up).
    min_history: int = 5
    #: Robust z beyond which a jump is an anomaly.
    z_threshold: float = 5.0
    #: A change must also exceed this many standard errors of the difference (the noise floor).
    noise_sigmas: float = 3.0
    #: The MAD's floor relative to the baseline, and in absolute terms: a plateau must not divide by 0.
    relative_floor: float = 0.01
    absolute_floor: float = 1e-9
    #: EWMA of standardised residuals: weight of the newest, and the limit in its own sigmas.
    ewma_lambda: float = 0.25
    ewma_limit: float = 3.5
    #: CUSUM of standardised residuals: slack per point and decision threshold.
    cusum_k: float = 0.5
    cusum_h: float = 4.0
    #: Drop from the best (smoothed) value, in standard errors of the difference.
    drop_sigmas: float = 3.5
    #: RL rules: length up by this factor; entropy down to this share; zero-spread groups above this.
    length_ratio: float = 1.5
    entropy_ratio: float = 0.3
    zero_spread_level: float = 0.5
