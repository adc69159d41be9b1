"""The capability rule's guard: the wire's message schema is pinned.

Every message rejects unknown fields, so a new field or message reaches only a peer that
advertised its capability (docs/protocol.md, "Extending the wire: the capability rule"). This
test keeps the schema of every frame equal to `tests/wire_schema.json`: a change to a message
fails here until the snapshot is updated, which is the moment to add the capability that gates
it (`CODEMODE_UPDATE_WIRE_SCHEMA=1` rewrites the snapshot).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec

from codemode.protocol import CAPABILITIES, ClientMessage, HostMessage

SNAPSHOT = Path(__file__).with_name("wire_schema.json")


def _schema() -> dict[str, object]:
    (client, host), components = msgspec.json.schema_components([ClientMessage, HostMessage])
    return {
        "capabilities": sorted(CAPABILITIES),
        "client_to_host": client,
        "host_to_client": host,
        "components": components,
    }


def test_the_wire_schema_changes_only_with_its_capabilities() -> None:
    current = json.loads(json.dumps(_schema(), sort_keys=True))
    if os.environ.get("CODEMODE_UPDATE_WIRE_SCHEMA"):
        SNAPSHOT.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    pinned = json.loads(SNAPSHOT.read_text())
    assert current == pinned, (
        "a wire message changed: gate the new field or message behind a capability both ends"
        " advertise (docs/protocol.md), then update tests/wire_schema.json"
    )
