"""frozen.record behaves as @dataclass(frozen=True) does, and
frozen.mutable_record as @dataclass."""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import subprocess
import sys
from typing import ClassVar

import pytest

from dmtcp_py.frozen import MISSING, field, fields, is_record, mutable_record, record


@record
class Point:
    x: int
    y: int = 0
    tags: tuple = dataclasses.field(default_factory=tuple)


@dataclasses.dataclass(frozen=True)
class Twin:
    x: int
    y: int = 0
    tags: tuple = dataclasses.field(default_factory=tuple)


@record
class Checked:
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("negative")


@record
class Child(Point):
    z: int = 5


@pytest.mark.parametrize("args, kwargs", [((1,), {}), ((1, 2), {}), ((), {"x": 3, "y": 4}),
                                          ((1,), {"tags": (7,)})])
def test_same_values_as_a_dataclass(args, kwargs):
    p, t = Point(*args, **kwargs), Twin(*args, **kwargs)
    assert dataclasses.astuple(p) == dataclasses.astuple(t)
    assert repr(p) == repr(t).replace("Twin", "Point")
    assert hash(p) == hash(Point(*args, **kwargs))
    assert p == Point(*args, **kwargs) and p != t


@pytest.mark.parametrize("args, kwargs", [((), {}), ((1, 2, (), 4), {}), ((1,), {"x": 2}),
                                          ((1,), {"w": 2})])
def test_wrong_arguments_are_refused_as_by_a_dataclass(args, kwargs):
    with pytest.raises(TypeError):
        Twin(*args, **kwargs)
    with pytest.raises(TypeError):
        Point(*args, **kwargs)


def test_frozen_and_replaceable():
    p = Point(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.y
    assert dataclasses.replace(p, y=9) == Point(1, 9)
    assert dataclasses.is_dataclass(p) and [f.name for f in dataclasses.fields(p)] == \
        ["x", "y", "tags"]


def test_post_init_checks_and_subclasses_add_fields():
    with pytest.raises(ValueError):
        Checked(-1)
    assert Child(1, 2, (), 3).z == 3 and Child(1) != Point(1)
    assert repr(Child(1)) == "Child(x=1, y=0, tags=(), z=5)"


def test_fields_it_cannot_keep_are_refused():
    with pytest.raises(TypeError):
        @record
        class Hidden:
            x: int = dataclasses.field(default=0, compare=False)


@mutable_record
class Counter:
    name: str
    seen: list = dataclasses.field(default_factory=list)
    total: int = 0


@dataclasses.dataclass
class CounterTwin:
    name: str
    seen: list = dataclasses.field(default_factory=list)
    total: int = 0


def test_a_mutable_record_is_a_plain_dataclass():
    c, t = Counter("a"), CounterTwin("a")
    c.total += 2
    c.seen.append(1)
    t.total, t.seen = 2, [1]
    assert dataclasses.astuple(c) == dataclasses.astuple(t)
    assert repr(c) == repr(t).replace("CounterTwin", "Counter")
    assert c == Counter("a", [1], 2) and c != t
    assert Counter("b").seen is not Counter("b").seen  # a factory's value each
    with pytest.raises(TypeError):
        hash(c)  # as a dataclass with its __eq__: unhashable
    with pytest.raises(TypeError):
        Counter("a", [], 0, 1)
    assert dataclasses.replace(c, total=5) == Counter("a", [1], 5)


# ---- records made without the dataclasses module ------------------------------

LIGHT = """
import sys
from dmtcp_py.frozen import MISSING, field, fields, is_record, mutable_record, record

@record
class Point:
    x: int
    y: int = 0
    tags: tuple = field(default_factory=tuple)

@mutable_record
class Bag:
    name: str
    items: list = field(default_factory=list)

p, b = Point(1, tags=(2,)), Bag("b")
b.items.append(1)
match p:
    case Point(x, y):
        matched = (x, y)
assert (p == Point(1, 0, (2,)), hash(p) == hash(Point(1, 0, (2,))), matched) == (True, True, (1, 0))
assert repr(b) == "Bag(name='b', items=[1])" and Bag("c").items == []
print(" ".join(sorted(sys.modules)))
"""


def test_records_are_made_and_used_without_loading_dataclasses():
    loaded = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True,
                            check=True).stdout.split()
    assert "dmtcp_py.frozen" in loaded
    assert not {"dataclasses", "inspect", "typing"} & set(loaded)


@record
class Light:
    """Defaults given with frozen.field."""
    x: int
    y: int = 3
    seen: tuple = field(default_factory=tuple)
    LIMIT: ClassVar[int] = 9


@dataclasses.dataclass(frozen=True)
class LightTwin:
    """The same, as a dataclass."""
    x: int
    y: int = 3
    seen: tuple = dataclasses.field(default_factory=tuple)
    LIMIT: ClassVar[int] = 9


def test_a_record_is_a_dataclass_once_asked():
    assert "seen" not in vars(Light)  # (as dataclass leaves a factory's field)
    assert [(f.name, f.default, f.default_factory) for f in dataclasses.fields(Light)] == \
        [(f.name, f.default, f.default_factory) for f in dataclasses.fields(LightTwin)]
    r = Light(1, seen=(4,))
    assert dataclasses.asdict(r) == {"x": 1, "y": 3, "seen": (4,)}
    assert dataclasses.replace(r, y=5) == Light(1, 5, (4,))
    assert "seen" not in vars(Light) and Light.LIMIT == 9
    assert Light.__match_args__ == LightTwin.__match_args__ == ("x", "y", "seen")


def test_what_a_dataclass_refuses_a_record_refuses_at_once():
    with pytest.raises(ValueError):
        @record
        class Shared:
            items: list = []  # one list for every instance
    with pytest.raises(TypeError):
        @record
        class Order:
            x: int = 0
            y: int
    with pytest.raises(ValueError):
        field(default=1, default_factory=int)


def _records() -> list[type]:
    """Every record class of the package."""
    import dmtcp_py
    found = {}
    for info in pkgutil.walk_packages(dmtcp_py.__path__, "dmtcp_py."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and "_record_fields" in vars(value):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


def test_every_record_has_the_fields_dataclass_finds():
    records = _records()
    assert len(records) > 90
    for cls in records:  # (making it a dataclass compares the two, else TypeError)
        names = [f.name for f in dataclasses.fields(cls)]
        assert names == [f.name for f in fields(cls)], cls


def test_fields_and_their_metadata_without_dataclasses():
    @record
    class Ranged:
        n: int = field(default=0, metadata={"min": 0})
        tags: tuple = field(default_factory=tuple)

    n, tags = fields(Ranged)
    assert (n.name, n.default, n.default_factory, n.metadata) == ("n", 0, MISSING, {"min": 0})
    assert (tags.name, tags.default, tags.default_factory) == ("tags", MISSING, tuple)
    assert fields(Ranged(1)) is fields(Ranged)
    assert is_record(Ranged(1)) and is_record(Ranged) and not is_record(3)
    with pytest.raises(TypeError):
        fields(3)
    assert dataclasses.fields(Ranged)[0].metadata == {"min": 0}  # (the dataclass view keeps it)
