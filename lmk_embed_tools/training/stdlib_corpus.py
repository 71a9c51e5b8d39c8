"""An offline long-document retrieval corpus: Python's standard-library documentation.

Each module's page, rendered by `pydoc` as plain text, is a document; the first line of its
docstring (its synopsis) is the query. The synopsis is removed from the page, so the query
never occurs verbatim in its document. Nothing is downloaded: the pages come from the running
interpreter, so the corpus is always available (its exact content follows the Python version).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import os
import pydoc
import re
import sys
import warnings
from dataclasses import dataclass

# Modules with side effects on import (a browser, a printed poem, GUI or packaging tools).
SKIPPED_MODULES = frozenset(
    {
        "antigravity", "this", "idlelib", "turtledemo", "tkinter", "turtle", "lib2to3", "ensurepip",
        "venv", "pydoc_data", "msilib", "winreg", "winsound", "msvcrt", "nt",
    }
)
MIN_SYNOPSIS_WORDS = 3


@dataclass(frozen=True)
class ModulePage:
    name: str
    synopsis: str
    text: str


def synopsis_of(obj) -> str:
    """The first line of an object's own docstring (not one inherited from a base class), or ''."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    doc = inspect.cleandoc(doc) if isinstance(doc, str) else ""
    return doc.splitlines()[0].strip() if doc else ""


def import_quietly(name: str):
    """Import a module with its warnings and prints silenced; None when it cannot be imported."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except Exception:  # a module that needs a platform feature we lack
            return None


# Rendered default values that change from run to run: object addresses, and the process
# environment (cgi's defaults repr `os.environ`, which must never enter a corpus).
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|(?<=handle )[0-9a-f]{8,}")
_ENVIRON = re.compile(r"environ\(\{.*?\}\)")
_ENVIRON_CUT = re.compile(r"environ\(\{(?!\.\.\.\}\))[^\n]*")  # pydoc's shortened reprs, to the end of the line


# Values made at import time, different in every process: uuid-like ids (transformers' SESSION_ID)
# and the random arrays of examples whose docstrings are rendered at import ("# may vary").
_RANDOM_ID = re.compile(r"'[0-9a-f]{32}'")
_MAY_VARY = re.compile(r"^(\W*)\S.*?(\s+# may vary)$", re.MULTILINE)
# A set of objects hashed by address (polars' dtypes) prints in a new order every run; pydoc cuts
# long reprs, so the elements cannot be sorted back: an elided set keeps only its type.
_ELIDED_SET = re.compile(r"\b((?:frozen)?set)\(\{[^\n]*\.\.\.(?:\}\))?$", re.MULTILINE)


def _machine_paths() -> list[str]:
    """Folders of this installation and run (the interpreter's prefixes, the working folder, home), longest first."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.getcwd(), os.path.expanduser("~")}
    return sorted((p for p in paths if len(p) > 1), key=len, reverse=True)


def _without_machine_paths(text: str) -> str:
    for path in _machine_paths():
        text = text.replace(path, "...")
    return text


class _PathFreeRepr(pydoc.TextRepr):
    """pydoc's value repr with the machine's paths replaced *before* it cuts a long repr to 100
    characters, so that how much of a value shows does not depend on how long the install folder's name is."""

    def repr_string(self, x, level):
        return super().repr_string(_without_machine_paths(x), level)

    repr_str = repr_string

    def repr1(self, x, level):  # as pydoc's, with the paths replaced in the fallback
        if hasattr(self, "repr_" + "_".join(type(x).__name__.split())):
            return super().repr1(x, level)
        return pydoc.cram(pydoc.stripid(_without_machine_paths(repr(x))), self.maxother)


class _PathFreeTextDoc(pydoc.TextDoc):
    """`pydoc.plaintext` (TextDoc without overstruck bold) with `_PathFreeRepr` for values."""

    _repr_instance = _PathFreeRepr()
    repr = _repr_instance.repr

    def bold(self, text):
        return text


_RENDERER = _PathFreeTextDoc()


def render_page(obj) -> str:
    """pydoc's plain-text page of `obj`, without what changes from run to run or machine to machine:
    addresses, environment variables, import-time random values and the installation's paths."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = pydoc.render_doc(obj, renderer=_RENDERER)
    text = _ENVIRON_CUT.sub("environ({...})", _ENVIRON.sub("environ({...})", text))
    text = _RANDOM_ID.sub("'...'", _ADDRESS.sub("", text))
    # Each of these needs its literal to match; the check skips seconds of regex on sympy's 30 MB pages.
    if "# may vary" in text:
        text = _MAY_VARY.sub(r"\1...\2", text)
    if "set({" in text:
        text = _ELIDED_SET.sub(r"\1({...})", text)
    # Paths outside value reprs (a module's FILE, docstrings) are not cut, so they are replaced here.
    return _without_machine_paths(text)


def stdlib_module_names() -> list[str]:
    return sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIPPED_MODULES)


def module_pages() -> list[ModulePage]:
    """Every importable public stdlib module with a synopsis of at least three words, sorted by name.

    All modules are imported before any page is rendered: a package's page lists the submodules
    imported so far, so rendering as we go would make pages depend on the import order.
    """
    modules = {name: import_quietly(name) for name in stdlib_module_names()}
    pages = []
    for name, module in modules.items():
        if module is None:
            continue
        synopsis = synopsis_of(module)
        if len(synopsis.split()) < MIN_SYNOPSIS_WORDS:
            continue
        text = render_page(module).replace(synopsis, " ")
        pages.append(ModulePage(name, synopsis, text))
    return pages
