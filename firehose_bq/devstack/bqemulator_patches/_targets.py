"""Finding what a patch wraps, by name, and failing loudly when it is gone.

A patch written against one bqemulator version must not run silently unapplied against another: an
emulator that quietly behaves unlike BigQuery gives misleading test results. Every module and attribute
a patch touches is looked up through `module` / `require` / `replace`, which raise
`PatchTargetMissingError` naming the missing dotted path; the launcher then exits with status 3.
"""


import importlib
import logging
from types import ModuleType
from typing import Any


class PatchTargetMissingError(RuntimeError):
    """A module or attribute that a patch wraps is missing from the installed bqemulator."""


def module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise PatchTargetMissingError(f"module {name} cannot be imported: {exc}") from exc


def dotted(owner: Any) -> str:
    if isinstance(owner, ModuleType):
        return owner.__name__
    return f"{owner.__module__}.{owner.__qualname__}"


def require(owner: Any, attr: str) -> Any:
    """Return ``owner.attr``, or raise with the dotted name of whatever is missing."""
    if not hasattr(owner, attr):
        raise PatchTargetMissingError(f"{dotted(owner)}.{attr} no longer exists")
    return getattr(owner, attr)


def replace(owner: Any, attr: str, new: Any) -> str:
    """Replace ``owner.attr`` (which must exist) with ``new``, and return its dotted name for the log."""
    require(owner, attr)
    setattr(owner, attr, new)
    return f"{dotted(owner)}.{attr}"


# A child of the launcher's logger, whose handler survives bqemulator's `basicConfig(force=True)`.
LOG = logging.getLogger("bqemulator_launcher.patches")
