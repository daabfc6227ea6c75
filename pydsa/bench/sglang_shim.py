"""sglang 0.5.23's own modules without its runtime: its package entered without the package __init__
(which imports the whole server), and the third-party modules its imported modules name but that are
not installed (triton, zmq, ...) stood in for by permissive stand-ins. Used by the benchmarks' reference
build (pydsa/bench/reference.py) and by the test that runs sglang's wheel against pydsa's plugin."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types


class _Base:
    def __init_subclass__(cls, **kwargs):
        pass

    def __init__(self, *args, **kwargs):
        pass


class _Stand(types.ModuleType):
    """A missing third-party module: every attribute is another stand-in, a call returns one, and as a
    decorator it returns what it decorates."""

    def __init__(self, name):
        super().__init__(name)
        self.__path__ = []

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        child = _Stand(f"{self.__name__}.{name}")
        setattr(self, name, child)
        return child

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Stand(self.__name__ + "()")

    def __mro_entries__(self, bases):
        return (_Base,)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stands in for the named top-level modules (and their submodules) only."""

    def __init__(self):
        self.names = set()

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _Stand(spec.name)

    def exec_module(self, module):
        pass


KEEP = ("sglang", "torch", "pydsa", "pyplan", "numpy")


def enter(root: str | None = None) -> StandIns:
    """Makes `import sglang.x` load sglang's modules from `root` (the folder holding the sglang package;
    default: where it is installed) without running its package __init__; returns the stand-in finder."""
    if root is None:
        root = importlib.util.find_spec("sglang").submodule_search_locations[0]
    else:
        root = f"{root}/sglang"
    package = types.ModuleType("sglang")
    package.__path__ = [root]
    sys.modules["sglang"] = package
    stand_ins = StandIns()
    sys.meta_path.insert(0, stand_ins)
    return stand_ins


def import_all(modules, stand_ins: StandIns, real=()) -> list:
    """Imports sglang's `modules`, standing in for each third-party module found missing (except those
    named in `real`, which must be there); the modules."""
    for _ in range(64):
        try:
            return [importlib.import_module(name) for name in modules]
        except ModuleNotFoundError as exc:
            top = (exc.name or "").split(".")[0]
            if not top or top in stand_ins.names or top in KEEP or top in real:
                raise
            stand_ins.names.add(top)
            for name in [m for m in sys.modules if m.startswith("sglang.")]:
                del sys.modules[name]
    raise ImportError(f"sglang's modules {modules} did not import with {sorted(stand_ins.names)} stood in for")
