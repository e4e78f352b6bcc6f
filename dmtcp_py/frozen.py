"""@record: a frozen dataclass whose methods are written once, here;
@mutable_record: the same for a plain (mutable) @dataclass.

@dataclass(frozen=True) compiles an __init__, __eq__, __hash__, __repr__,
__setattr__ and __delattr__ of its own for every class (six exec() calls).
The protocol's messages and the machines' actions are ~70 such classes:
that was 25-35 ms of every coordinator, agent and restart before it did
anything.  A record takes the methods below, which read its fields.  Equal,
hashable, immutable and printed as a frozen dataclass is; what it does not
support is said where it is refused: fields that are not in __init__, or
compared apart.  A mutable record (a plain @dataclass took ~0.7 ms for 8
fields, a record 0.07) is equal and printed the same way, can be assigned
to, and is unhashable.

A record is made without the dataclasses module: its fields are read here
from the class's annotations and defaults.  dataclasses (with inspect, which
it loads: ~10 ms here) stood before CRIU in every restart, for the
manifest.  A record still is a dataclass to dataclasses' own functions
(fields(), replace(), asdict(), is_dataclass()): the first of them to ask
makes it one, with dataclass() itself (_DataclassView), and finds the same
fields.  Give defaults with field() from here, or dataclasses.field() in a
module that loads dataclasses anyway.
"""
from __future__ import annotations

import sys
from _thread import RLock

TYPE_CHECKING = False  # (typing's own costs 4-7 ms of import)
if TYPE_CHECKING:
    from typing import Any


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # no default (dataclasses.MISSING in a dataclass's view)


_making = RLock()  # one thread makes a class a dataclass; a base's view may ask again


class _Field:
    """What field() leaves in a record's class body."""
    __slots__ = ("default", "default_factory")

    def __init__(self, default: Any, default_factory: Any) -> None:
        self.default, self.default_factory = default, default_factory


def field(*, default: Any = MISSING, default_factory: Any = MISSING) -> Any:
    """A record's field with a default or a default factory, as
    dataclasses.field(default=..., default_factory=...) gives it."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot give both default and default_factory")
    return _Field(default, default_factory)


def record(cls: type) -> type:
    """Decorate a class as @dataclass(frozen=True) would."""
    return _decorate(cls, _METHODS)


def mutable_record(cls: type) -> type:
    """Decorate a class as @dataclass would."""
    return _decorate(cls, _MUTABLE_METHODS)


def _decorate(cls: type, methods: dict[str, Any]) -> type:
    if cls.__doc__ is None:  # else dataclass derives one, with inspect
        cls.__doc__ = cls.__name__
    with _making:  # (a base being made a dataclass has field() values in its body)
        return _decorate_fields(cls, methods)


def _decorate_fields(cls: type, methods: dict[str, Any]) -> type:
    spec: dict[str, tuple] = {}
    for base in reversed(cls.__mro__[1:]):  # a base record's fields come first
        for each in base.__dict__.get("_record_fields", ()):
            spec[each[0]] = each
    body: dict[str, Any] = {}  # field() values, for dataclass() to see again
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        # (as dataclass reads it: a base's default counts)
        default, factory = getattr(cls, name, MISSING), MISSING
        if isinstance(default, _Field) or _is_dataclasses_field(default):
            body[name] = given = default
            default, factory = _plain_default(cls, name, given)
        if isinstance(default, (list, dict, set)):
            raise ValueError(f"{cls.__name__}.{name}: mutable default {type(default).__name__} "
                             "is not allowed: use default_factory")
        if default is MISSING:  # as dataclass leaves the class's attributes
            if name in cls.__dict__:
                delattr(cls, name)
        else:
            setattr(cls, name, default)
        spec[name] = (name, default, factory)  # (a redefined field keeps its place)
    required_after = None
    for name, default, factory in spec.values():
        if default is MISSING and factory is MISSING and required_after is not None:
            raise TypeError(f"{cls.__name__}: non-default argument {name!r} follows "
                            f"default argument {required_after!r}")
        if default is not MISSING or factory is not MISSING:
            required_after = required_after or name
    cls._record_fields = tuple(spec.values())
    cls._record_body = body
    if "__match_args__" not in cls.__dict__:  # (match statements: case Kind(a, b))
        cls.__match_args__ = tuple(spec)
    cls.__dataclass_fields__ = _DataclassView(cls)
    for name, method in methods.items():
        if cls.__dict__.get(name) is None:  # (a class's own __eq__ sets __hash__ None)
            setattr(cls, name, method)
    return cls


def _is_classvar(annotation: Any) -> bool:
    """typing.ClassVar[...], written or as a string (annotations are
    strings under `from __future__ import annotations`)."""
    if isinstance(annotation, str):
        head = annotation.strip().split("[", 1)[0].strip()
        return head in ("ClassVar", "typing.ClassVar")
    typing = sys.modules.get("typing")  # (a written one: its module loaded it)
    return typing is not None and (annotation is typing.ClassVar
                                   or getattr(annotation, "__origin__", None) is typing.ClassVar)


def _is_dataclasses_field(value: Any) -> bool:
    dataclasses = sys.modules.get("dataclasses")  # (it made one: it is loaded)
    return dataclasses is not None and isinstance(value, dataclasses.Field)


def _plain_default(cls: type, name: str, given: Any) -> tuple[Any, Any]:
    """(default, default_factory) of a field() value, in our MISSING."""
    if isinstance(given, _Field):
        return given.default, given.default_factory
    import dataclasses
    if not given.init or not given.compare or given.hash is not None or given.kw_only is True:
        raise TypeError(f"{cls.__name__}.{name}: a record's fields are plain")
    default = MISSING if given.default is dataclasses.MISSING else given.default
    factory = MISSING if given.default_factory is dataclasses.MISSING else given.default_factory
    return default, factory


class _DataclassView:
    """A record's __dataclass_fields__ until something asks for it: then
    dataclass() makes the class a dataclass (its fields' defaults as the
    class body gave them), which puts the real one in place."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __get__(self, obj: Any, owner: type) -> dict:
        cls = self.cls
        with _making:
            if cls.__dict__.get("__dataclass_fields__") is self:
                _make_dataclass(cls)
        return cls.__dict__["__dataclass_fields__"]


def _make_dataclass(cls: type) -> None:
    import dataclasses
    for name, given in cls._record_body.items():
        if isinstance(given, _Field):
            given = dataclasses.field(
                default=dataclasses.MISSING if given.default is MISSING else given.default,
                default_factory=(dataclasses.MISSING if given.default_factory is MISSING
                                 else given.default_factory))
        setattr(cls, name, given)
    del cls.__dataclass_fields__  # (dataclass() asks only its bases for theirs)
    dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    # the same fields as the record's own, or a record reads other ones
    made = tuple((f.name, MISSING if f.default is dataclasses.MISSING else f.default,
                  MISSING if f.default_factory is dataclasses.MISSING else f.default_factory)
                 for f in dataclasses.fields(cls))
    if made != cls._record_fields:
        raise TypeError(f"{cls.__name__}: dataclass() found the fields {made}, "
                        f"the record {cls._record_fields}")


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
        elif default is not MISSING:
            value = default
        elif factory is not MISSING:
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
    from dataclasses import FrozenInstanceError
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self, name: str) -> None:
    from dataclasses import FrozenInstanceError
    raise FrozenInstanceError(f"cannot delete field {name!r}")


_METHODS = {"__init__": _init, "__eq__": _eq, "__hash__": _hash, "__repr__": _repr,
            "__setattr__": _setattr, "__delattr__": _delattr}
# (not hashable, as a plain dataclass with its __eq__ is)
_MUTABLE_METHODS = {"__init__": _init, "__eq__": _eq, "__repr__": _repr, "__hash__": None}
