"""The output a cell printed (its engine's output events, as content items) and no observation
took yet, and the responses that carry it away.

Rules:
1. Items leave in order, and only whole: an observation takes the first items that fit its
   byte budget (`_observer.fitting`); an item that alone exceeds the budget stays, and that
   observation fails with `FrameLimitError` (the pending output limit keeps items below it).
2. Whatever leaves is reported to the engine (`output_taken`), which gives the cell room again
   under its pending output limit; the engine and this buffer count an item alike
   (`_observer.item_bytes`).
"""

from __future__ import annotations

from codemode_host.engine import EngineCell, ImageOutput, TextOutput

from codemode import (
    Completed,
    ContentItem,
    ImageDetail,
    InputImage,
    InputText,
    Pending,
    Yielded,
)
from codemode.errors import FrameLimitError

from ._observer import fitting, item_bytes


class CellOutput:
    """The undelivered items of one cell.

    Args:
        cell_id: for error texts.
        engine_cell: told what leaves (rule 2).
        budget: the most bytes one observation takes (None: no limit).
    """

    __slots__ = ("_budget", "_cell_id", "_engine_cell", "_items")

    def __init__(self, cell_id: str, engine_cell: EngineCell, budget: int | None) -> None:
        self._cell_id = cell_id
        self._engine_cell = engine_cell
        self._budget = budget
        self._items: list[ContentItem] = []

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size(self) -> int:
        """The bytes the items take, as a response counts them."""
        return sum(item_bytes(item) for item in self._items)

    def add(self, event: TextOutput | ImageOutput) -> ContentItem:
        """The item a `text()` or an `image()` of the cell made (returned, too)."""
        item: ContentItem
        if isinstance(event, TextOutput):
            item = InputText(text=event.text)
        else:
            item = InputImage(image_url=event.image_url, detail=ImageDetail(event.detail))
        self._items.append(item)
        return item

    def fits(self, budget: int | None) -> bool:
        """Whether every item fits in one observation of `budget` bytes."""
        return fitting(self._items, len(self._items), budget) == len(self._items)

    def take(self, count: int) -> list[ContentItem]:
        """The first of `count` items that fit the budget (rule 1).

        Raises:
            FrameLimitError: the next item alone exceeds the budget (it stays).
        """
        fit = fitting(self._items, count, self._budget)
        if fit == 0 and count > 0:
            raise FrameLimitError(
                f"code-mode observation of exec cell {self._cell_id} exceeds the IPC frame"
                f" limit: its next output item takes {item_bytes(self._items[0])} bytes; it"
                " stays in the cell"
            )
        items = self._items[:fit]
        del self._items[:fit]
        self._taken(items)
        return items

    def take_all(self) -> list[ContentItem]:
        """Every item, whatever the budget (a completion claimed by a terminate, a
        termination)."""
        items, self._items = self._items, []
        self._taken(items)
        return items

    def yielded(self, count: int) -> Yielded:
        """A `Yielded` of the first of `count` items that fit the budget (as `take`)."""
        return Yielded(cell_id=self._cell_id, content_items=self.take(count))

    def pending(self, items: list[ContentItem], tool_call_ids: list[str]) -> Pending:
        """A frontier observer's `Pending` of `items` (taken already)."""
        return Pending(
            cell_id=self._cell_id, content_items=items, pending_tool_call_ids=tool_call_ids
        )

    def completed(self, error_text: str | None) -> Completed:
        """The completion, with every item (`take_all`)."""
        return Completed(
            cell_id=self._cell_id, content_items=self.take_all(), error_text=error_text
        )

    def _taken(self, items: list[ContentItem]) -> None:
        if items:
            self._engine_cell.output_taken(sum(item_bytes(item) for item in items))
