"""One training step, one evaluation: which shape of a step saved twice is the checkpoint (pure).

OpenRLHF with ``--save_hf_ckpt`` saves every step as ``_actor/global_stepN`` (DeepSpeed engine shards) and
``global_stepN_hf`` (``save_pretrained``); a trainer may keep a resumable checkpoint beside an HF export of
the same step. Both are the same weights: evaluating both doubles the work and puts two points at one step
in every curve, comparison and detector. So when a shape of a step becomes ready:

- another shape of that step is already ready (evaluated or about to be): this one is its **alternate**,
  recorded against it and never evaluated, even if it is the preferred shape (its result would repeat
  the other's);
- else, another shape still being written is *preferred* (``runs[].prefer``, by default the HF export
  first: it is what users deploy) : this one waits for it, and becomes its alternate once it is ready,
  or the checkpoint if it ends invalid or vanishes;
- else it is the checkpoint.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from inference.layouts import Shape
from storage.models import CheckpointState

DEFAULT_PREFERENCE = (Shape.HF_EXPORT, Shape.RESUMABLE)


class Choice(enum.StrEnum):
    CHECKPOINT = "checkpoint"
    ALTERNATE = "alternate"
    WAIT = "wait"


@dataclass(frozen=True)
class Other:
    """Another live shape of the same step: its checkpoint row, its shape."""

    id: int
    name: str
    state: CheckpointState
    shape: Shape


@dataclass(frozen=True)
class Decision:
    choice: Choice
    #: The other shape it is an alternate of, or waits for.
    other: Other | None = None

    def reason(self, shape: Shape, name: str | None = None) -> str:
        """Why, for the folder of ``shape`` named ``name`` in its run."""
        if self.other is None:
            return "the only shape of its step"
        if self.choice is Choice.ALTERNATE and name == self.other.name:
            # The same name under the run: its root (an s3 run's cache_dir, a remount) moved since.
            return f"{name} again, recorded at another path before the run's root moved: evaluated once"
        if self.choice is Choice.ALTERNATE:
            return f"another shape ({shape}) of {self.other.name}'s step, which is evaluated instead"
        return f"waits for {self.other.name} ({self.other.shape}), the preferred shape of the same step"


def rank(shape: Shape, preference: Sequence[Shape]) -> int:
    """Where ``shape`` comes in ``preference`` (lower first); a shape it leaves out comes after all."""
    return preference.index(shape) if shape in preference else len(preference)


def choose(
    shape: Shape, others: Sequence[Other], preference: Sequence[Shape] = DEFAULT_PREFERENCE
) -> Decision:
    """What a shape that just became ready is, given the step's other live shapes (oldest first)."""
    ready = [o for o in others if o.state is CheckpointState.READY]
    if ready:
        return Decision(Choice.ALTERNATE, ready[0])
    mine = rank(shape, preference)
    better = [o for o in others if rank(o.shape, preference) < mine]
    if better:
        return Decision(Choice.WAIT, better[0])
    return Decision(Choice.CHECKPOINT)
