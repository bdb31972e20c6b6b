"""`sorted_in_chunks`: exactly `sorted`, and no single C sort over more than a chunk."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connect_protocol import ordering
from connect_protocol.resources import TaskId


@given(st.lists(st.tuples(st.text(max_size=3), st.integers(-5, 50)), max_size=300))
def test_it_sorts_exactly_as_sorted(items: list[tuple[str, int]]) -> None:
    chunk = ordering.CHUNK
    ordering.CHUNK = 7  # many chunks, small inputs
    try:
        assert ordering.sorted_in_chunks(items) == sorted(items)
        assert ordering.sorted_in_chunks(iter(items)) == sorted(items)
    finally:
        ordering.CHUNK = chunk


def test_no_c_sort_is_given_more_than_a_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real = sorted

    def counting_sorted(items: Any, **kwargs: Any) -> list[Any]:
        listed = list(items)
        sizes.append(len(listed))
        return real(listed, **kwargs)

    monkeypatch.setattr(ordering, "sorted", counting_sorted, raising=False)
    tasks = {TaskId(f"c{n % 977}", n) for n in range(100_000)}

    out = ordering.sorted_in_chunks(tasks)

    assert out == real(tasks)
    assert sizes and max(sizes) <= ordering.CHUNK
