"""Token-budget truncation of what the model sees (reference 7.5), byte for byte.

Rules:
1. A token is approximated as 4 bytes of UTF-8: `ceil(bytes / 4)` tokens, `4 * N` bytes for a
   budget of N tokens.
2. Middle truncation keeps the longest prefix of whole characters within half the byte budget
   and the suffix of whole characters within the other half, joined by the marker
   `…{R} tokens truncated…`, R being the removed bytes in tokens (rounded up).
3. Items that are all text are joined with newlines and, when over budget, replaced by one
   warning item; with an image among them, texts are kept in order while the budget lasts, the
   first one over it is middle-truncated, later ones are counted as omitted, images are kept.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._api import ContentItem, InputText

BYTES_PER_TOKEN = 4


def approx_token_count(text: str) -> int:
    """The approximate token count of `text`: its UTF-8 bytes divided by 4, rounded up."""
    return _tokens_for_bytes(len(text.encode()))


def _tokens_for_bytes(count: int) -> int:
    return -(-count // BYTES_PER_TOKEN)


def _line_count(text: str) -> int:
    # Counted like Rust's `str::lines()`, which the reference's warning quotes: a final line
    # break does not start another line, and only "\n" separates lines.
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def truncate_middle(text: str, max_tokens: int) -> str:
    """`text` cut in the middle to about `max_tokens` tokens, or unchanged if it fits.

    Args:
        text: any text.
        max_tokens: the budget; 0 leaves only the marker.

    Returns:
        `text` itself when it fits, else its prefix, the marker `…{R} tokens truncated…` and
        its suffix, cut on character boundaries.

    >>> truncate_middle("abcdef", 0)
    '…2 tokens truncated…'
    """
    data = text.encode()
    budget = max_tokens * BYTES_PER_TOKEN
    if not data or (len(data) <= budget and max_tokens > 0):
        return text
    if budget == 0:
        return f"…{_tokens_for_bytes(len(data))} tokens truncated…"
    # Character boundaries found on the bytes: a UTF-8 continuation byte is 0b10xxxxxx.
    prefix_end = budget // 2
    while prefix_end > 0 and data[prefix_end] & 0xC0 == 0x80:
        prefix_end -= 1
    suffix_start = len(data) - (budget - budget // 2)
    while suffix_start < len(data) and data[suffix_start] & 0xC0 == 0x80:
        suffix_start += 1
    suffix_start = max(suffix_start, prefix_end)
    marker = f"…{_tokens_for_bytes(len(data) - budget)} tokens truncated…"
    return data[:prefix_end].decode() + marker + data[suffix_start:].decode()


def truncate_items(items: Sequence[ContentItem], max_tokens: int) -> list[ContentItem]:
    """The content items cut to a budget of `max_tokens` tokens (reference 7.5).

    Args:
        items: text and image items, in order.
        max_tokens: the token budget of their texts (images cost nothing).

    Returns:
        A new list. All-text items that fit are returned unchanged; all-text items over budget
        become one item `Warning: truncated output (original token count: {n})\\nTotal output
        lines: {lines}\\n\\n{middle-truncated text}`. With images, see the module rules;
        `[omitted {n} text items ...]` closes the list when texts were dropped.
    """
    if all(isinstance(item, InputText) for item in items):
        return _truncate_all_text(
            [item for item in items if isinstance(item, InputText)], max_tokens
        )
    return _truncate_mixed(items, max_tokens)


def _truncate_all_text(items: Sequence[InputText], max_tokens: int) -> list[ContentItem]:
    joined = "\n".join(item.text for item in items)
    size = len(joined.encode())
    if not items or size <= max_tokens * BYTES_PER_TOKEN:
        return list(items)
    warning = (
        f"Warning: truncated output (original token count: {_tokens_for_bytes(size)})\n"
        f"Total output lines: {_line_count(joined)}\n\n{truncate_middle(joined, max_tokens)}"
    )
    return [InputText(text=warning)]


def _truncate_mixed(items: Sequence[ContentItem], max_tokens: int) -> list[ContentItem]:
    kept: list[ContentItem] = []
    remaining = max_tokens
    omitted = 0
    for item in items:
        if not isinstance(item, InputText):
            kept.append(item)
            continue
        if not item.text:
            continue
        if remaining == 0:
            omitted += 1
            continue
        cost = approx_token_count(item.text)
        if cost <= remaining:
            kept.append(item)
            remaining -= cost
            continue
        snippet = truncate_middle(item.text, remaining)
        if snippet:
            kept.append(InputText(text=snippet))
        else:
            omitted += 1
        remaining = 0
    if omitted:
        kept.append(InputText(text=f"[omitted {omitted} text items ...]"))
    return kept
