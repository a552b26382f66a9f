"""What the safe unpicklers read beyond their lists of globals, and what they say when they refuse.

Python 3.11.0 to 3.11.4 (Debian 12's ``python3.11`` among them) pickle an enum member as a call of the
builtin ``getattr`` on its class and its name; earlier and later releases as a call of the class on its
value. A checkpoint a trainer wrote under them names ``builtins.getattr`` wherever it holds an enum
(DeepSpeed's ZeRO stage, DCP's memory format), and the safe unpicklers, which allow no builtin function,
refused every such checkpoint. They read ``builtins.getattr`` as :func:`member` instead, which does that
one thing: an enum class's member by name. The class itself must still be one they allow.
"""

from __future__ import annotations

import enum
import pickle

#: How a pickle names ``getattr``: protocols 0 to 2 spell ``builtins`` as Python 2's ``__builtin__``.
GETATTR = frozenset({("builtins", "getattr"), ("__builtin__", "getattr")})
#: torch's restricted unpickler's own marker before the reason it refused, and its advice after it (to
#: allowlist the global, or to read the docs), which is not advice for a checkpoint evald refuses.
_TORCH_REASON = "WeightsUnpickler error:"
_TORCH_ADVICE = ("Please use `torch.serialization", "Check the documentation of torch.load")


def member(cls: object, name: object) -> enum.Enum:
    """``cls[name]`` where ``cls`` is an enum class and ``name`` one of its members; refused otherwise."""
    if isinstance(cls, enum.EnumMeta) and isinstance(name, str) and name in cls.__members__:
        found: enum.Enum = cls.__members__[name]
        return found
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not an enum member by name: refused")


#: What ``torch.serialization.safe_globals`` takes to read ``builtins.getattr`` as :func:`member` (torch
#: reads ``__builtin__`` as ``builtins`` itself).
AS_GETATTR = (member, "builtins.getattr")


def refusal(exc: pickle.UnpicklingError) -> str:
    """Why an unpickler refused, on one line: for torch's ``weights_only`` loader, its reason without the
    paragraph of advice around it (which names ``weights_only=False``, never an option here)."""
    text = str(exc)
    if _TORCH_REASON in text:
        text = text.split(_TORCH_REASON, 1)[1]
    for advice in _TORCH_ADVICE:
        text = text.split(advice, 1)[0]
    flat = " ".join(text.split())
    return flat[:300] if flat else type(exc).__name__
