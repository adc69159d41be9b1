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
