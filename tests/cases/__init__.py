"""One module per layout, each with ``build(tmp: Path) -> LayoutCase`` (see ``tests.checkpoints``)."""

from __future__ import annotations

from typing import Any

import pytest

#: ZeRO-2 writes ZeRO-1's files (model states, then each rank's partitioned optimizer states): the same
#: layout and completeness rule. Its writer run (two DeepSpeed ranks, about 45 s of a make-test process)
#: goes in `make test-long`; ZeRO-1's covers the layout in `make test`.
LONG_CASES = frozenset({"deepspeed_zero2"})


def long_if_zero2(name: str) -> Any:
    """``name`` as a parameter, marked long where its layout is another case's (``LONG_CASES``)."""
    return pytest.param(name, marks=pytest.mark.long) if name in LONG_CASES else name
