"""Logging configured the moment structlog is imported, not before: a command that never logs never pays
for it.

``import structlog`` costs a third of what ``evald results`` needs besides reading the database (it imports
rich, pygments and asyncio with it). Most commands print what they read and log nothing; those that do
(``run``, ``retry``, ``status`` with a resource probe) import structlog somewhere in their code, and that
import is what configures it here, before the importing module can ask for a logger. Configured no later
than that, no log line can ever leave through structlog's default (printing to standard output, where it
would mix with the command's own output).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    # Only its type: importlib.abc imports importlib.resources (as much as the rest of this module).
    from importlib.abc import Loader

#: The module whose first import configures logging.
MODULE = "structlog"


class _ConfiguringLoader:
    """Runs the module as its own loader would, then ``configure``; hands the module back to that loader."""

    def __init__(self, inner: Loader, configure: Callable[[], None]) -> None:
        self._inner = inner
        self._configure = configure

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # What asks the module's loader later (importlib.resources, reload) meets the real one.
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        self._configure()


class ConfigureOnImport:
    """A finder that finds nothing itself: it lets the others find :data:`MODULE` and wraps its loader, once.

    :meth:`install` configures at once where the module is already imported (a test calling ``main`` in a
    process that logged before)."""

    def __init__(self, configure: Callable[[], None]) -> None:
        self._configure = configure

    def install(self) -> None:
        if MODULE in sys.modules:
            self._configure()
        else:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        """Takes the finder away where nothing imported the module (a later call installs its own)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        self.remove()
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = cast("Loader", _ConfiguringLoader(spec.loader, self._configure))
        return spec
