"""slurm_multi.record: a class body read as typing.NamedTuple reads it, without importing typing."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from slurm_multi.record import record


class Typed(NamedTuple):
    """The reference."""

    name: str
    count: int = 0
    tags: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.name}:{self.count}"


@record
class Ours:
    """The reference."""

    name: str
    count: int = 0
    tags: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.name}:{self.count}"


@pytest.mark.parametrize(
    "args, kwargs", [(("a",), {}), (("a", 2), {}), (("a",), {"tags": ("x",)}), ((), {"name": "b"})]
)
def test_a_record_is_the_named_tuple_of_the_same_body(args: tuple, kwargs: dict) -> None:
    typed, ours = Typed(*args, **kwargs), Ours(*args, **kwargs)
    assert ours == typed and tuple(ours) == tuple(typed) and hash(ours) == hash(typed)
    assert ours._fields == Typed._fields == ("name", "count", "tags")
    assert ours._asdict() == typed._asdict()
    assert ours.label == typed.label
    assert ours._replace(count=5) == typed._replace(count=5)
    assert repr(ours) == repr(typed).replace("Typed", "Ours")
    assert Ours.__doc__ == Typed.__doc__ and Ours.__name__ == "Ours" and Ours.__module__ == __name__


def test_a_record_is_immutable_and_takes_no_new_attributes() -> None:
    ours = Ours("a")
    with pytest.raises(AttributeError):
        ours.name = "b"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        ours.other = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        Ours()  # the field without a default


def test_a_field_without_a_default_after_one_with_is_refused_as_named_tuple_refuses_it() -> None:
    with pytest.raises(TypeError, match="without a default follows"):

        @record
        class Bad:
            first: int = 0
            second: int
