"""What every frame shares: the base of the tagged message structs and their id type (the
checks their `__post_init__` runs are `_message_checks`)."""

from __future__ import annotations

from typing import Annotated, TypeAlias

import msgspec

RequestId: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]
"""Operation ids (client-allocated) and delegate ids (host-allocated): from 1 per connection."""


class Message(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="type"
):
    pass
