"""Smoothing of a metric series, the same function for the dashboard, ``evald compare`` and ``evald plot``.

Pure functions over a list of floats, one value per checkpoint in step order. Two kinds, as TensorBoard
and W&B offer them:

**EMA with TensorBoard's debiasing** (weight ``w``, ``0 <= w < 1``). Over the finite points only, counted
``k = 1, 2, …``::

    last_0 = 0
    last_k = w * last_{k-1} + (1 - w) * v_k
    s_k    = last_k / (1 - w**k)

Dividing by ``1 - w**k`` removes the pull towards the zero start (the weights ``(1-w) w**j`` of the
points seen so far sum to ``1 - w**k``), so the first smoothed value is the first value itself instead of
``(1-w) * v_1``. A non-finite point (NaN, ±inf) passes through unchanged and neither advances ``k`` nor
enters ``last``: a NaN in the series shows as a NaN, not as a curve that never recovers. ``w = 0`` is no
smoothing. This is TensorBoard's ``vz_line_chart`` smoothing exactly.

**Centred moving window** (odd width ``n = 2h + 1``). The mean of the finite points among positions
``i - h … i + h`` that exist::

    s_i = mean{ v_j : |j - i| <= h, 0 <= j < len, v_j finite }

At the edges the window is cut at the end of the series (it shrinks, as pandas'
``rolling(n, center=True, min_periods=1)``), so the first value averages ``v_0 … v_h``. A non-finite
point passes through unchanged and is left out of its neighbours' means. Positions, not step distances:
a series with gaps in its steps is smoothed over its checkpoints, as TensorBoard does.

**Standard errors** go through the same linear weights, assuming the checkpoints' errors independent:
a smoothed value ``s = sum_j c_j v_j`` has ``se(s) = sqrt(sum_j c_j**2 se_j**2)``. For the EMA,
``c_j = (1 - w) w**(k - j) / (1 - w**k)``; for the window, ``c_j = 1 / m`` over its ``m`` finite points.
One unknown standard error among the weights makes the smoothed one unknown (``None``).

Specs, as written on the command line and in the dashboard's query strings: ``none``, ``ema:0.6``,
``window:5`` (:func:`parse_smoothing`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from daemon.errors import SmoothingError

Kind = Literal["none", "ema", "window"]

SPEC_HELP = "'none', 'ema:W' with 0 <= W < 1 (e.g. ema:0.6), or 'window:N' with N odd >= 1 (e.g. window:5)"


def ema(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's debiased exponential moving average (formula in the module docstring)."""
    if not 0.0 <= weight < 1.0:
        raise SmoothingError(f"EMA weight {weight!r} is outside [0, 1)")
    out: list[float] = []
    last = 0.0
    count = 0
    for value in values:
        if not math.isfinite(value):
            out.append(value)
            continue
        last = last * weight + (1.0 - weight) * value
        count += 1
        out.append(last / (1.0 - weight**count))
    return out


def ema_stderr(values: Sequence[float], stderrs: Sequence[float | None], weight: float) -> list[float | None]:
    """Standard error of each :func:`ema` value (module docstring); None where unknown or not finite."""
    if not 0.0 <= weight < 1.0:
        raise SmoothingError(f"EMA weight {weight!r} is outside [0, 1)")
    out: list[float | None] = []
    variance: float | None = 0.0
    count = 0
    for value, stderr in zip(values, stderrs, strict=True):
        if not math.isfinite(value):
            out.append(None)
            continue
        count += 1
        if variance is None or stderr is None or not math.isfinite(stderr):
            variance = None
            out.append(None)
            continue
        variance = variance * weight**2 + ((1.0 - weight) * stderr) ** 2
        out.append(math.sqrt(variance) / (1.0 - weight**count))
    return out


def moving_window_stderr(
    values: Sequence[float], stderrs: Sequence[float | None], width: int
) -> list[float | None]:
    """Standard error of each :func:`moving_window` value (module docstring); None where unknown."""
    if width < 1 or width % 2 == 0:
        raise SmoothingError(f"window width {width!r} must be an odd integer >= 1")
    if len(values) != len(stderrs):
        raise ValueError(f"{len(values)} values but {len(stderrs)} standard errors")
    half = width // 2
    out: list[float | None] = []
    for i, value in enumerate(values):
        if not math.isfinite(value):
            out.append(None)
            continue
        around = [
            stderrs[j]
            for j in range(max(0, i - half), min(len(values), i + half + 1))
            if math.isfinite(values[j])
        ]
        known = [se for se in around if se is not None and math.isfinite(se)]
        out.append(
            math.sqrt(math.fsum(se * se for se in known)) / len(around) if len(known) == len(around) else None
        )
    return out


def moving_window(values: Sequence[float], width: int) -> list[float]:
    """Centred moving mean over ``width`` (odd) positions, cut at the ends (module docstring)."""
    if width < 1 or width % 2 == 0:
        raise SmoothingError(f"window width {width!r} must be an odd integer >= 1")
    half = width // 2
    out: list[float] = []
    for i, value in enumerate(values):
        if not math.isfinite(value):
            out.append(value)
            continue
        around = [v for v in values[max(0, i - half) : i + half + 1] if math.isfinite(v)]
        out.append(math.fsum(around) / len(around))
    return out


@dataclass(frozen=True)
class Smoothing:
    """A parsed smoothing spec; :meth:`apply` smooths one series."""

    kind: Kind = "none"
    #: EMA weight for ``ema``, width for ``window``; unused for ``none``.
    parameter: float = 0.0

    @property
    def spec(self) -> str:
        if self.kind == "ema":
            return f"ema:{self.parameter:g}"
        if self.kind == "window":
            return f"window:{int(self.parameter)}"
        return "none"

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def apply(self, values: Sequence[float]) -> list[float]:
        if self.kind == "ema":
            return ema(values, self.parameter)
        if self.kind == "window":
            return moving_window(values, int(self.parameter))
        return list(values)

    def apply_stderr(self, values: Sequence[float], stderrs: Sequence[float | None]) -> list[float | None]:
        """The standard error of each value :meth:`apply` returns (for ``none``: ``stderrs`` as given)."""
        if self.kind == "ema":
            return ema_stderr(values, stderrs, self.parameter)
        if self.kind == "window":
            return moving_window_stderr(values, stderrs, int(self.parameter))
        return list(stderrs)


NONE = Smoothing()


def parse_smoothing(spec: str) -> Smoothing:
    """Parse ``none``, ``ema:W`` or ``window:N``; a bad spec raises :class:`SmoothingError` naming it."""
    text = spec.strip().lower()
    if text in ("none", "", "off", "0"):
        return NONE
    kind, sep, raw = text.partition(":")
    if not sep or kind not in ("ema", "window"):
        raise SmoothingError(f"smoothing {spec!r} is not a known spec; use {SPEC_HELP}")
    if kind == "ema":
        try:
            weight = float(raw)
        except ValueError:
            raise SmoothingError(
                f"smoothing {spec!r}: EMA weight {raw!r} is not a number; use {SPEC_HELP}"
            ) from None
        if not (math.isfinite(weight) and 0.0 <= weight < 1.0):
            raise SmoothingError(f"smoothing {spec!r}: EMA weight must be in [0, 1); use {SPEC_HELP}")
        return Smoothing("ema", weight) if weight > 0 else NONE
    try:
        width = int(raw)
    except ValueError:
        raise SmoothingError(
            f"smoothing {spec!r}: window width {raw!r} is not an integer; use {SPEC_HELP}"
        ) from None
    if width < 1 or width % 2 == 0:
        raise SmoothingError(f"smoothing {spec!r}: window width must be odd and >= 1; use {SPEC_HELP}")
    return Smoothing("window", float(width)) if width > 1 else NONE
