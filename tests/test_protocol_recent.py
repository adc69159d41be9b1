"""The bounded books of recent ids (`codemode.protocol._recent`): the last `RECENT_IDS` values
are remembered, older ones forgotten; the numeric book answers as the generic one does."""

from __future__ import annotations

import random

import pytest

from codemode.protocol._recent import RECENT_IDS, RecentIds, RecentNumbers


@pytest.mark.parametrize("book", [RecentIds, RecentNumbers])
def test_the_last_ids_are_remembered_and_older_ones_forgotten(
    book: type[RecentIds] | type[RecentNumbers],
) -> None:
    recent = book()
    for value in range(1, RECENT_IDS + 11):
        recent.add(value)
    assert [value in recent for value in (1, 10, 11, RECENT_IDS + 10, RECENT_IDS + 11)] == [
        False,
        False,
        True,
        True,
        False,
    ]


def test_numbers_answer_as_the_generic_book_whatever_the_order() -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    generic, numbers = RecentIds(), RecentNumbers()
    added: list[int] = []
    for step in range(3 * RECENT_IDS):
        value = rng.choice([step + 1, rng.randrange(1, 2**63)])
        generic.add(value)
        numbers.add(value)
        added.append(value)
        if step % 101 == 0:
            for probe in [*added[-RECENT_IDS - 3 :], 0, 2**63 - 1, "1", None]:
                assert (probe in numbers) == (probe in generic), (seed, step, probe)


def test_numbers_stay_within_twice_the_book_whatever_the_order() -> None:
    """Forgotten values are cut off, not kept: ids that only grow (the smallest forgotten each
    time), then a mix; the book answers as the generic one throughout."""
    generic, numbers = RecentIds(), RecentNumbers()
    rng = random.Random(7)
    values = [*range(1, 5 * RECENT_IDS), *(rng.randrange(1, 2**63) for _ in range(RECENT_IDS))]
    for step, value in enumerate(values):
        generic.add(value)
        numbers.add(value)
        assert len(numbers._sorted) < 2 * RECENT_IDS
        if step % 997 == 0:
            for probe in values[max(0, step - RECENT_IDS - 3) : step + 3]:
                assert (probe in numbers) == (probe in generic), (step, probe)
