"""Every public function, class, method and property of the weft package has a docstring.

The walk covers the public names of weft, weft.topology, weft.pipe and weft.torch that are
functions or classes defined in the weft package (not the networkx, torch or NumPy objects
that those modules import), and the public methods and properties those classes define or
inherit from weft's own classes. No communication: every rank checks the same thing.
"""
import inspect


import weft
import weft.pipe
import weft.topology
import weft.torch

MODULES = (weft, weft.topology, weft.pipe, weft.torch)

def _in_weft(obj):
    module = getattr(obj, "__module__", None) or ""
    return module == "weft" or module.startswith("weft.")


def _qualname(obj):
    return f"{obj.__module__}.{obj.__qualname__}"


def _public_objects():
    """{qualified name: object} for every public function, class, method and property."""
    found = {}
    for module in MODULES:
        for name in dir(module):
            if name.startswith("_"):
                continue
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isroutine(obj)) or not _in_weft(obj):
                continue
            found.setdefault(_qualname(obj), obj)
            if not inspect.isclass(obj):
                continue
            for attr in dir(obj):
                if attr.startswith("_"):
                    continue
                owner = next((c for c in obj.__mro__ if attr in vars(c)), None)
                if owner is None or not _in_weft(owner):
                    continue  # inherited from object, Exception, torch.optim.Optimizer, ...
                value = vars(owner)[attr]
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                if isinstance(value, property) or inspect.isroutine(value):
                    found.setdefault(f"{_qualname(owner)}.{attr}", value)
    return found


def _undocumented(objects):
    return sorted(name for name, obj in objects.items() if not (obj.__doc__ or "").strip())


def test_the_walk_finds_the_public_api():
    objects = _public_objects()
    for name in ("weft.allreduce", "weft.Handle", "weft.topology.Topology.size",
                 "weft.topology.RingGraph", "weft.pipe.Plan.role", "weft._bluefog.init",
                 "weft.torch.DistributedAdaptWithCombineOptimizer",
                 "weft.torch._DistributedOptimizer.step",
                 "weft._step_counter.StepCounter.step"):
        assert name in objects, name
    # networkx and torch objects that the modules import are not weft's to document.
    assert not [name for name in objects if not name.startswith("weft.")]


def test_public_objects_have_docstrings():
    # The process queries (weft.rank is SWIG's weft_rank) included.
    objects = _public_objects()
    objects.update({f"weft.{name}": getattr(weft, name) for name in (
        "rank", "size", "local_rank", "local_size", "machine_rank", "machine_size")})
    missing = _undocumented(objects)
    assert not missing, (f"{len(missing)} public objects have no docstring:\n  "
                         + "\n  ".join(missing))
