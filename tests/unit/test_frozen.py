"""frozen.record behaves as @dataclass(frozen=True) does, and
frozen.mutable_record as @dataclass."""
from __future__ import annotations

import dataclasses

import pytest

from dmtcp_py.frozen import mutable_record, record


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
