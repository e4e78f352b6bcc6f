"""@record: a frozen dataclass whose methods are written once, here;
@mutable_record: the same for a plain (mutable) @dataclass.

@dataclass(frozen=True) compiles an __init__, __eq__, __hash__, __repr__,
__setattr__ and __delattr__ of its own for every class (six exec() calls).
The protocol's messages and the machines' actions are ~70 such classes:
that was 25-35 ms of every coordinator, agent and restart before it did
anything.  A record asks dataclass only for its fields (so fields(),
replace(), asdict() and is_dataclass() work as they did) and takes the
methods below, which read them.  Equal, hashable, immutable and printed as
a frozen dataclass is; what it does not support is said where it is
refused: fields that are not in __init__, or compared apart.  A mutable
record (a plain @dataclass took ~0.7 ms for 8 fields, a record 0.07) is
equal and printed the same way, can be assigned to, and is unhashable.
"""
from __future__ import annotations

import dataclasses
from typing import Any

_MISSING = dataclasses.MISSING


def record(cls: type) -> type:
    """Decorate a class as @dataclass(frozen=True) would."""
    return _decorate(cls, _METHODS)


def mutable_record(cls: type) -> type:
    """Decorate a class as @dataclass would."""
    return _decorate(cls, _MUTABLE_METHODS)


def _decorate(cls: type, methods: dict[str, Any]) -> type:
    if cls.__doc__ is None:  # else dataclass derives one, with inspect
        cls.__doc__ = cls.__name__
    cls = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    fields = dataclasses.fields(cls)
    for f in fields:
        if not f.init or not f.compare or f.hash is not None or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: a record's fields are plain")
    cls._record_fields = tuple((f.name, f.default, f.default_factory) for f in fields)
    for name, method in methods.items():
        if cls.__dict__.get(name) is None:  # (a class's own __eq__ sets __hash__ None)
            setattr(cls, name, method)
    return cls


def _init(self, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    spec = cls._record_fields
    if len(args) > len(spec):
        raise TypeError(f"{cls.__name__}() takes {len(spec)} positional arguments "
                        f"but {len(args)} were given")
    put = object.__setattr__
    for (name, _, _), value in zip(spec, args):
        if name in kwargs:
            raise TypeError(f"{cls.__name__}() got multiple values for argument {name!r}")
        put(self, name, value)
    used = 0
    for name, default, factory in spec[len(args):]:
        if name in kwargs:
            value = kwargs[name]
            used += 1
        elif default is not _MISSING:
            value = default
        elif factory is not _MISSING:
            value = factory()
        else:
            raise TypeError(f"{cls.__name__}() missing required argument {name!r}")
        put(self, name, value)
    if used != len(kwargs):
        names = {name for name, _, _ in spec}
        unknown = next(k for k in kwargs if k not in names)
        raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {unknown!r}")
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


def _values(self) -> tuple:
    return tuple(getattr(self, name) for name, _, _ in type(self)._record_fields)


def _eq(self, other: object) -> bool:
    if other.__class__ is self.__class__:
        return _values(self) == _values(other)
    return NotImplemented


def _hash(self) -> int:
    return hash(_values(self))


def _repr(self) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name, _, _ in type(self)._record_fields)
    return f"{type(self).__qualname__}({shown})"


def _setattr(self, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


_METHODS = {"__init__": _init, "__eq__": _eq, "__hash__": _hash, "__repr__": _repr,
            "__setattr__": _setattr, "__delattr__": _delattr}
# (not hashable, as a plain dataclass with its __eq__ is)
_MUTABLE_METHODS = {"__init__": _init, "__eq__": _eq, "__repr__": _repr, "__hash__": None}
