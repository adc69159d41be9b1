"""Images checked and resized before the model sees them (reference 7.4)."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from codemode import ContentItem, ImageDetail, InputImage, InputText
from codemode.model import IMAGE_OMITTED
from codemode.model import _images as images


def png_bytes(width: int, height: int, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A real PNG, built with the standard library only."""
    row = b"\x00" + bytes(rgb) * width
    raw = row * height

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def png_data_url(width: int = 2, height: int = 2) -> str:
    return data_url(png_bytes(width, height))


def decoded_size(url: str) -> tuple[int, int, str]:
    data = base64.b64decode(url.partition(",")[2])
    with Image.open(io.BytesIO(data)) as image:
        return image.width, image.height, str(image.format)


def encoded(format_name: str, width: int, height: int, mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), "red").save(buffer, format=format_name)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "url",
    [
        "",
        "https://example.com/a.png",
        "file:///tmp/a.png",
        "data:image/png;base64",  # no comma
        "data:image/png,AAAA",  # not base64
        "data:image/png;base64,",  # empty
        "data:image/png;base64,%%%",
        "data:image/png;base64,AAA",  # bad padding
        data_url(b"not an image at all"),
        data_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40),  # a PNG signature, then garbage
        data_url(png_bytes(4, 4)[:-20]),  # truncated
    ],
)
def test_malformed_images_become_the_omitted_text(url: str) -> None:
    assert images.prepare_image(InputImage(image_url=url)) == InputText(text=IMAGE_OMITTED)


def test_a_valid_image_keeps_its_url_and_gets_an_explicit_detail() -> None:
    url = png_data_url()
    assert images.prepare_image(InputImage(image_url=url)) == InputImage(
        image_url=url, detail=ImageDetail.HIGH
    )
    assert images.prepare_image(InputImage(image_url=url, detail=ImageDetail.LOW)) == InputImage(
        image_url=url, detail=ImageDetail.LOW
    )


@pytest.mark.parametrize(
    ("format_name", "media_type"),
    [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("GIF", "image/gif"), ("WEBP", "image/webp")],
)
def test_the_media_type_is_the_one_the_bytes_show(format_name: str, media_type: str) -> None:
    data = encoded(format_name, 3, 2)
    assert images.sniff_media_type(data) == media_type
    for declared in (media_type, "application/octet-stream", "IMAGE/PNG"):
        prepared = images.prepare_image(InputImage(image_url=data_url(data, declared)))
        assert prepared == InputImage(image_url=data_url(data, media_type), detail=ImageDetail.HIGH)


def test_an_original_image_is_resized_to_the_reference_size() -> None:
    # The reference's vector: a 6401x100 PNG with detail `original` is shown at 6000x94.
    item = InputImage(image_url=png_data_url(6401, 100), detail=ImageDetail.ORIGINAL)
    prepared = images.prepare_image(item)
    assert isinstance(prepared, InputImage)
    assert prepared.detail is ImageDetail.ORIGINAL
    assert prepared.image_url.startswith("data:image/png;base64,")
    assert decoded_size(prepared.image_url) == (6000, 94, "PNG")


@pytest.mark.parametrize(
    ("size", "limits", "expected"),
    [
        ((6401, 100), images.ORIGINAL_LIMITS, (6000, 94)),
        ((6000, 6000), images.ORIGINAL_LIMITS, (3200, 3200)),
        ((100, 100), images.ORIGINAL_LIMITS, (100, 100)),
        ((4096, 2048), images.DEFAULT_LIMITS, (2048, 1024)),
        ((2048, 2048), images.DEFAULT_LIMITS, (1600, 1600)),
        ((1, 100_000), images.DEFAULT_LIMITS, (1, 2048)),
        ((3000, 1), images.DEFAULT_LIMITS, (2048, 1)),
    ],
)
def test_fit_respects_both_limits(
    size: tuple[int, int], limits: images.ImageLimits, expected: tuple[int, int]
) -> None:
    width, height = images.fit(*size, limits)
    assert (width, height) == expected
    assert max(width, height) <= limits.max_side
    patches = -(-width // images.PATCH_SIZE) * -(-height // images.PATCH_SIZE)
    assert patches <= limits.max_patches


def test_large_images_of_other_details_are_resized_to_the_default_limits() -> None:
    jpeg = encoded("JPEG", 4096, 100)
    prepared = images.prepare_image(InputImage(image_url=data_url(jpeg, "image/jpeg")))
    assert isinstance(prepared, InputImage)
    assert prepared.image_url.startswith("data:image/jpeg;base64,")
    assert decoded_size(prepared.image_url) == (2048, 50, "JPEG")
    gif = encoded("GIF", 3000, 10, mode="P")
    prepared = images.prepare_image(InputImage(image_url=data_url(gif), detail=ImageDetail.AUTO))
    assert isinstance(prepared, InputImage)
    assert decoded_size(prepared.image_url) == (2048, 7, "PNG")
    rgba_jpeg_source = encoded("PNG", 3000, 10, mode="RGBA")
    prepared = images.prepare_image(InputImage(image_url=data_url(rgba_jpeg_source)))
    assert isinstance(prepared, InputImage)
    assert decoded_size(prepared.image_url) == (2048, 7, "PNG")


def test_without_pillow_images_are_checked_but_not_resized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Stands for an installation without the `images` extra.
    monkeypatch.setattr(images, "_pillow", lambda: None)
    url = png_data_url(6401, 100)
    item = InputImage(image_url=url, detail=ImageDetail.ORIGINAL)
    assert images.prepare_image(item) == item
    truncated = data_url(png_bytes(4, 4)[:-20])  # only Pillow can tell
    assert isinstance(images.prepare_image(InputImage(image_url=truncated)), InputImage)
    assert images.prepare_image(InputImage(image_url=data_url(b"GIF00a"))) == InputText(
        text=IMAGE_OMITTED
    )


def test_prepare_images_keeps_texts_and_order() -> None:
    url = png_data_url()
    items: list[ContentItem] = [
        InputText(text="a"),
        InputImage(image_url="x"),
        InputImage(image_url=url),
    ]
    assert images.prepare_images(items) == [
        InputText(text="a"),
        InputText(text=IMAGE_OMITTED),
        InputImage(image_url=url, detail=ImageDetail.HIGH),
    ]
    assert images.has_images(items)
    assert not images.has_images(items[:1])
