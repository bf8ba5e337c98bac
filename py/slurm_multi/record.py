"""`@record`: a class body read as a NamedTuple (its annotations are the fields, in order; a class
attribute of a field's name is its default; methods, properties and the docstring stay), built by
collections.namedtuple. typing.NamedTuple does the same but lives in `typing`, whose import costs
every helper ~10 ms of CPU at start, on cores the job's own start shares."""

from __future__ import annotations

from collections import namedtuple

_NOT_COPIED = ("__dict__", "__weakref__")


def record(cls: type) -> type:
    """The NamedTuple class that `class cls(NamedTuple)` would have made of the same body."""
    fields = list(cls.__dict__.get("__annotations__", {}))
    defaults = []
    for name in fields:
        if name in cls.__dict__:
            defaults.append(cls.__dict__[name])
        elif defaults:
            raise TypeError(f"{cls.__name__}: field {name} without a default follows one with a default")
    base = namedtuple(cls.__name__, fields, defaults=defaults, module=cls.__module__)
    body = {key: value for key, value in cls.__dict__.items() if key not in fields and key not in _NOT_COPIED}
    body["__slots__"] = ()
    return type(cls.__name__, (base,), body)
