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
fields.  fields() and is_record() here read a record's fields without that
(the protocol's messages check every field by them when built: a
dataclass() of each kind, in each process that used it, was ~0.06 ms).  Give
defaults and metadata with field() from here, or dataclasses.field() in a
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


class Field:
    """One field of a record (fields()), or what field() leaves in a
    record's class body (name None)."""
    __slots__ = ("name", "default", "default_factory", "metadata")

    def __init__(self, name: str | None, default: Any, default_factory: Any,
                 metadata: dict) -> None:
        self.name, self.default, self.default_factory = name, default, default_factory
        self.metadata = metadata

    def __repr__(self) -> str:
        return (f"Field(name={self.name!r}, default={self.default!r}, "
                f"default_factory={self.default_factory!r}, metadata={self.metadata!r})")


def field(*, default: Any = MISSING, default_factory: Any = MISSING,
          metadata: dict | None = None) -> Any:
    """A record's field with a default or a default factory, and metadata
    for the record's own use, as dataclasses.field gives them."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot give both default and default_factory")
    return Field(None, default, default_factory, metadata or {})


def fields(record_or_class: Any) -> tuple[Field, ...]:
    """A record's fields, in order (without making it a dataclass)."""
    cls = record_or_class if isinstance(record_or_class, type) else type(record_or_class)
    found = getattr(cls, "_record_fields", None)
    if found is None:
        raise TypeError(f"{cls.__name__} is not a record")
    return found


def is_record(value: Any) -> bool:
    """value is a record or a record's class."""
    cls = value if isinstance(value, type) else type(value)
    return hasattr(cls, "_record_fields")


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
    spec: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):  # a base record's fields come first
        for each in base.__dict__.get("_record_fields", ()):
            spec[each.name] = each
    body: dict[str, Any] = {}  # field() values, for dataclass() to see again
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        # (as dataclass reads it: a base's default counts)
        default, factory, metadata = getattr(cls, name, MISSING), MISSING, {}
        if isinstance(default, Field) or _is_dataclasses_field(default):
            body[name] = given = default
            default, factory, metadata = _plain_default(cls, name, given)
        if isinstance(default, (list, dict, set)):
            raise ValueError(f"{cls.__name__}.{name}: mutable default {type(default).__name__} "
                             "is not allowed: use default_factory")
        if default is MISSING:  # as dataclass leaves the class's attributes
            if name in cls.__dict__:
                delattr(cls, name)
        else:
            setattr(cls, name, default)
        # (a redefined field keeps its place)
        spec[name] = Field(name, default, factory, metadata)
    required_after = None
    for f in spec.values():
        if f.default is MISSING and f.default_factory is MISSING and required_after is not None:
            raise TypeError(f"{cls.__name__}: non-default argument {f.name!r} follows "
                            f"default argument {required_after!r}")
        if f.default is not MISSING or f.default_factory is not MISSING:
            required_after = required_after or f.name
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


def _plain_default(cls: type, name: str, given: Any) -> tuple[Any, Any, dict]:
    """(default, default_factory, metadata) of a field() value, in our
    MISSING."""
    if isinstance(given, Field):
        return given.default, given.default_factory, given.metadata
    import dataclasses
    if not given.init or not given.compare or given.hash is not None or given.kw_only is True:
        raise TypeError(f"{cls.__name__}.{name}: a record's fields are plain")
    default = MISSING if given.default is dataclasses.MISSING else given.default
    factory = MISSING if given.default_factory is dataclasses.MISSING else given.default_factory
    return default, factory, dict(given.metadata)


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
        if isinstance(given, Field):
            given = dataclasses.field(
                default=dataclasses.MISSING if given.default is MISSING else given.default,
                default_factory=(dataclasses.MISSING if given.default_factory is MISSING
                                 else given.default_factory), metadata=given.metadata)
        setattr(cls, name, given)
    del cls.__dataclass_fields__  # (dataclass() asks only its bases for theirs)
    dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    # the same fields as the record's own, or a record reads other ones
    made = tuple((f.name, MISSING if f.default is dataclasses.MISSING else f.default,
                  MISSING if f.default_factory is dataclasses.MISSING else f.default_factory)
                 for f in dataclasses.fields(cls))
    if made != tuple((f.name, f.default, f.default_factory) for f in cls._record_fields):
        raise TypeError(f"{cls.__name__}: dataclass() found the fields {made}, "
                        f"the record {cls._record_fields}")


def _init(self, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    spec = cls._record_fields
    if len(args) > len(spec):
        raise TypeError(f"{cls.__name__}() takes {len(spec)} positional arguments "
                        f"but {len(args)} were given")
    put = object.__setattr__
    for f, value in zip(spec, args):
        if f.name in kwargs:
            raise TypeError(f"{cls.__name__}() got multiple values for argument {f.name!r}")
        put(self, f.name, value)
    used = 0
    for f in spec[len(args):]:
        name = f.name
        if name in kwargs:
            value = kwargs[name]
            used += 1
        elif f.default is not MISSING:
            value = f.default
        elif f.default_factory is not MISSING:
            value = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}() missing required argument {name!r}")
        put(self, name, value)
    if used != len(kwargs):
        names = {f.name for f in spec}
        unknown = next(k for k in kwargs if k not in names)
        raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {unknown!r}")
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


def _values(self) -> tuple:
    return tuple(getattr(self, f.name) for f in type(self)._record_fields)


def _eq(self, other: object) -> bool:
    if other.__class__ is self.__class__:
        return _values(self) == _values(other)
    return NotImplemented


def _hash(self) -> int:
    return hash(_values(self))


def _repr(self) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in type(self)._record_fields)
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
