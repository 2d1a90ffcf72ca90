"""Modules loaded on first use. A command-line call (`beads close`, `sling`) is a new process
each time, so what only some paths need (networkx for staging and graphs) must not be paid at
start-up by every command. The import still sits at the top of the module that uses it; the
module itself is imported when one of its attributes is first read. No Django here.

Not importlib's LazyLoader: on Python 3.11 a thread reading an attribute while another runs
the module's code sees it half made (a web process draws two pages at once: "module
'networkx' has no attribute 'topological_sort'"). Here the first reader imports the module
through the import system, which other threads wait on, and every reader then gets the real
module's attribute."""

import importlib
import importlib.util
import threading
from types import ModuleType
from typing import Any


class LazyModule(ModuleType):
    """Stands for a module until an attribute is read; never put in sys.modules, so a plain
    `import` elsewhere gets the real module."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._real: ModuleType | None = None
        self._lock = threading.Lock()

    def __getattr__(self, attr: str) -> Any:  # called only for what the proxy does not hold
        real = self._real
        if real is None:
            with self._lock:
                if self._real is None:
                    self._real = importlib.import_module(self.__name__)
                real = self._real
        return getattr(real, attr)


def lazy_module(name: str) -> ModuleType:
    """`name`, imported on the first attribute access (at once if it already is)."""
    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return LazyModule(name)
