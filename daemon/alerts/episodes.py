"""Alert episodes read off a judged series (pure): where each metric alert's latest episode starts, ends and
resolves, whatever order the results were stored in.

An episode of a rule on a metric is a run of consecutive judged steps at which it fired; it resolves at the
first judged step after it where the rule no longer fires, and is still firing when it reaches the newest
step. The alert row of a fingerprint holds its latest episode, so it is this function of the ordered
series, and the same set of alerts with the same onsets comes out of newest-first, oldest-first or
backfilled evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from daemon.anomaly import Finding


@dataclass(frozen=True)
class Episode:
    first_step: int
    last_step: int
    #: The judged step that ended it; ``None`` while it fires at the newest step.
    resolved_step: int | None
    #: Its finding at ``last_step``: what the alert says (value, baseline, message, severity).
    latest: Finding
    #: Steps it fired at.
    repeats: int

    @property
    def firing(self) -> bool:
        return self.resolved_step is None

    def overlaps(self, first: int | None, last: int | None) -> bool:
        """Whether the steps ``first..last`` (a stored episode) share a step with this one."""
        return first is not None and last is not None and first <= self.last_step and self.first_step <= last


def latest_episodes(judged: Mapping[int, Sequence[Finding]]) -> dict[tuple[str, str], Episode]:
    """(rule, metric) → its latest episode, from findings per judged step (step order, every judged step
    present, an empty list where nothing fired)."""
    episodes: dict[tuple[str, str], Episode] = {}
    for step, findings in judged.items():
        fired: dict[tuple[str, str], Finding] = {}
        for finding in findings:
            fired.setdefault((finding.rule, finding.metric), finding)
        for key, episode in list(episodes.items()):
            if episode.firing and key not in fired:
                episodes[key] = Episode(
                    episode.first_step, episode.last_step, step, episode.latest, episode.repeats
                )
        for key, finding in fired.items():
            going = episodes.get(key)
            if going is not None and going.firing:
                episodes[key] = Episode(going.first_step, step, None, finding, going.repeats + 1)
            else:
                episodes[key] = Episode(step, step, None, finding, 1)
    return episodes
