"""Modules loaded on first use. A command-line call (`beads close`, `sling`) is a new process
each time, so what only some paths need (networkx for staging and graphs) must not be paid at
start-up by every command. The import still sits at the top of the module that uses it; the
module's code runs when one of its attributes is first read. No Django here."""

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """`name`, imported now if it already is, else on the first attribute access."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
