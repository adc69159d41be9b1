"""Token-budget truncation (reference 7.5): the vectors of 9.9 and 9.11, byte for byte."""

from __future__ import annotations

from codemode import ContentItem, InputImage, InputText, truncate_items, truncate_middle
from codemode.model import approx_token_count

IMAGE = InputImage(image_url="data:image/png;base64,AAAA")


def test_truncate_with_token_budget_returns_original_when_under_limit() -> None:
    assert truncate_middle("short output", 100) == "short output"


def test_truncate_with_token_budget_reports_truncation_at_zero_limit() -> None:
    assert truncate_middle("abcdef", 0) == "…2 tokens truncated…"


def test_truncate_middle_tokens_handles_utf8_content() -> None:
    text = "😀😀😀😀😀😀😀😀😀😀\nsecond line with text\n"
    assert truncate_middle(text, 8) == "😀😀😀😀…8 tokens truncated… line with text\n"


def test_truncate_middle_tokens_handles_chinese() -> None:
    assert truncate_middle("一二三四五六七八九十", 3) == "一二…5 tokens truncated…九十"


def test_approx_token_count_for_chinese_uses_byte_heuristic() -> None:
    assert approx_token_count("中文") == 2
    assert approx_token_count("中文测试") == 3


def test_truncated_text_output_starts_with_warning() -> None:
    items = truncate_items([InputText(text="0123456789" * 4)], 5)
    assert items == [
        InputText(
            text="Warning: truncated output (original token count: 10)\nTotal output lines: 1\n\n"
            "0123456789…5 tokens truncated…0123456789"
        )
    ]


def test_truncate_middle_edges() -> None:
    assert truncate_middle("", 0) == ""
    assert truncate_middle("abcd", 1) == "abcd"
    assert truncate_middle("abcde", 1) == "ab…1 tokens truncated…de"
    # A character wider than either half of the budget is dropped, never split.
    assert truncate_middle("😀😀😀", 1) == "…2 tokens truncated…"
    assert truncate_middle("a😀b", 1) == "a…1 tokens truncated…b"


def test_all_text_items_are_joined_with_newlines_and_counted_like_rust_lines() -> None:
    fitting = [InputText(text="abc"), InputText(text=""), InputText(text="defg")]
    assert truncate_items(fitting, 3) == fitting  # "abc\n\ndefg" is 9 bytes, 12 fit
    assert truncate_items(fitting, 2) == [  # 8 do not
        InputText(
            text="Warning: truncated output (original token count: 3)\nTotal output lines: 3\n\n"
            "abc\n…1 tokens truncated…defg"
        )
    ]
    [warning] = truncate_items([InputText(text="a\nb\n"), InputText(text="c" * 20)], 2)
    assert warning == InputText(
        text="Warning: truncated output (original token count: 7)\nTotal output lines: 4\n\n"
        "a\nb\n…5 tokens truncated…cccc"
    )
    # A final line break does not start another line.
    [warning] = truncate_items([InputText(text="a\n" * 10)], 1)
    assert isinstance(warning, InputText)
    assert warning.text.startswith(
        "Warning: truncated output (original token count: 5)\nTotal output lines: 10\n\n"
    )
    assert truncate_items([], 0) == []


def test_items_with_images_keep_images_and_count_omitted_texts() -> None:
    items: list[ContentItem] = [
        InputText(text="a" * 8),
        IMAGE,
        InputText(text=""),
        InputText(text="b" * 40),
        InputText(text="c"),
        InputText(text="d"),
    ]
    assert truncate_items(items, 4) == [
        InputText(text="a" * 8),
        IMAGE,
        InputText(text="bbbb…8 tokens truncated…bbbb"),
        InputText(text="[omitted 2 text items ...]"),
    ]
    assert truncate_items(items, 0) == [IMAGE, InputText(text="[omitted 4 text items ...]")]
    assert truncate_items(items, 100) == [item for item in items if item != InputText(text="")]
