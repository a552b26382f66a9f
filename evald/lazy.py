"""A package's names imported from their modules when first asked for (PEP 562), so that importing the
package costs only what a caller uses: ``evald results`` imports the results table, not every view."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any


def export(package: str, homes: Mapping[str, str], name: str) -> Any:
    """``package.name`` from its module (``homes[name]``, in ``package``), kept in the package afterwards like
    any import; ``AttributeError`` for a name the package does not have."""
    home = homes.get(name)
    if home is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{package}.{home}"), name)
    setattr(sys.modules[package], name, value)
    return value
