"""How long texts (prompts, responses, references) are cut before a sample output is stored.

Generated samples and lm-eval's alike are cut the same way, so this sits below both.
"""

from __future__ import annotations

#: Closes text cut to ``max_text_chars``.
CUT_MARKER = "…[cut]"


def cut_text(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its start and :data:`CUT_MARKER`."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(CUT_MARKER))] + CUT_MARKER
