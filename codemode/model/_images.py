"""Images a cell outputs, checked before the model sees them (reference 7.4).

Rules:
1. An image must be a base64 `data:` URL whose bytes are a PNG, JPEG, GIF or WebP image (the
   formats both model APIs take). Anything else becomes the text item
   `image content omitted because it could not be processed`; the response's success is not
   affected. The URL's media type is corrected to the one the bytes show.
2. Every image leaves with an explicit detail (`high` when the cell gave none).
3. With Pillow installed (`pip install 'codemode[images]'`), the image is also decoded (a
   truncated or corrupt file is omitted as in rule 1) and shrunk to fit its detail's limits:
   `original` at most 6000 pixels a side and 10,000 patches of 32x32 pixels, other details at
   most 2048 pixels a side and 2,500 patches. A resized image keeps its format if it is a PNG or
   a JPEG and becomes a PNG otherwise. Without Pillow, images pass through unresized.

Pure functions; decoding a large image takes a while, so callers run `prepare_images` in a
worker thread. Pillow is imported on first use only.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import math
from collections.abc import Sequence
from types import ModuleType
from typing import NamedTuple

from .._api import ContentItem, ImageDetail, InputImage, InputText

IMAGE_OMITTED = "image content omitted because it could not be processed"
PATCH_SIZE = 32


class ImageLimits(NamedTuple):
    """How large an image may be shown to the model."""

    max_side: int
    max_patches: int


ORIGINAL_LIMITS = ImageLimits(max_side=6000, max_patches=10_000)
DEFAULT_LIMITS = ImageLimits(max_side=2048, max_patches=2_500)

_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff_media_type(data: bytes) -> str | None:
    """The media type the bytes of an image show, among PNG, JPEG, GIF and WebP."""
    for signature, media_type in _SIGNATURES:
        if data.startswith(signature):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def decode_data_url(url: str) -> bytes | None:
    """The bytes of a base64 `data:` URL, or None if `url` is not one."""
    if url[:5].lower() != "data:":
        return None
    header, comma, payload = url[5:].partition(",")
    if not comma or header.split(";")[-1].strip().lower() != "base64":
        return None
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data or None


def fit(width: int, height: int, limits: ImageLimits) -> tuple[int, int]:
    """The size an image of `width` x `height` is shown at: unchanged when it fits, else the
    largest size with its aspect ratio within both limits.

    >>> fit(6401, 100, ORIGINAL_LIMITS)
    (6000, 94)
    """
    longest = max(width, height)

    def size(side: int) -> tuple[int, int]:
        scale = side / longest
        return max(1, round(width * scale)), max(1, round(height * scale))

    def fits(side: int) -> bool:
        scaled_width, scaled_height = size(side)
        patches = math.ceil(scaled_width / PATCH_SIZE) * math.ceil(scaled_height / PATCH_SIZE)
        return patches <= limits.max_patches

    # The patch count grows with the longest side: search the largest side that fits.
    low, high = 1, min(longest, limits.max_side)
    if fits(high):
        return size(high)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return size(low)


@functools.cache
def _pillow() -> ModuleType | None:
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image


def _resized(data: bytes, media_type: str, limits: ImageLimits) -> tuple[bytes, str]:
    image_module = _pillow()
    if image_module is None:
        return data, media_type
    with image_module.open(io.BytesIO(data)) as image:
        image.load()
        size = fit(image.width, image.height, limits)
        if size == image.size:
            return data, media_type
        resized = image.resize(size, image_module.Resampling.LANCZOS)
    buffer = io.BytesIO()
    if media_type == "image/jpeg":
        if resized.mode not in ("RGB", "L", "CMYK"):
            resized = resized.convert("RGB")
        resized.save(buffer, format="JPEG", quality=85)
        return buffer.getvalue(), media_type
    resized.save(buffer, format="PNG")
    return buffer.getvalue(), "image/png"


def prepare_image(item: InputImage) -> ContentItem:
    """One image checked (and resized with Pillow), or the text item that replaces it."""
    data = decode_data_url(item.image_url)
    media_type = sniff_media_type(data) if data is not None else None
    if data is None or media_type is None:
        return InputText(text=IMAGE_OMITTED)
    detail = item.detail or ImageDetail.HIGH
    limits = ORIGINAL_LIMITS if detail is ImageDetail.ORIGINAL else DEFAULT_LIMITS
    try:
        prepared, prepared_type = _resized(data, media_type, limits)
    except Exception:  # Pillow raises many kinds for a corrupt file; each means "omit it".
        return InputText(text=IMAGE_OMITTED)
    if prepared is data and item.image_url.startswith(f"data:{prepared_type};base64,"):
        return InputImage(image_url=item.image_url, detail=detail)
    encoded = base64.b64encode(prepared).decode("ascii")
    return InputImage(image_url=f"data:{prepared_type};base64,{encoded}", detail=detail)


def prepare_images(items: Sequence[ContentItem]) -> list[ContentItem]:
    """The items with every image checked and resized (module rules); texts unchanged."""
    return [prepare_image(item) if isinstance(item, InputImage) else item for item in items]


def has_images(items: Sequence[ContentItem]) -> bool:
    """Whether any of the items is an image."""
    return any(isinstance(item, InputImage) for item in items)
