"""A wire session as opened on one host link: its generation, and the translation between the
host's cell ids and the public ones (`g2:1` after a re-opening; design.md, host 1.4).
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import msgspec

from .._api import Pending, RuntimeResponse, WaitOutcome
from ..errors import CodeModeError, HostLostError, StaleGenerationError, error_from_kind
from ..protocol import Err, Ok, WaitCompleted
from ._link import HostLink

_OK: Final = Ok
"""An answer's exact class (a C static compiled): a failed `isinstance` against a msgspec
class costs about 600 instructions compiled, and nearly every answer is an `Ok`."""

_R = TypeVar("_R", bound=RuntimeResponse | Pending)


class Binding:
    """The session as opened on one host link."""

    def __init__(self, link: HostLink, session_id: str, generation: int) -> None:
        self.link = link
        self.session_id = session_id
        self.generation = generation

    def public_id(self, wire_id: str) -> str:
        return wire_id if self.generation == 1 else f"g{self.generation}:{wire_id}"

    def wire_id(self, public_id: str) -> str:
        if self.generation == 1:
            if public_id.startswith("g") and ":" in public_id:
                raise StaleGenerationError(public_id)
            return public_id
        prefix = f"g{self.generation}:"
        if not public_id.startswith(prefix):
            raise StaleGenerationError(public_id)
        return public_id[len(prefix) :]

    def response(self, response: _R) -> _R:
        """`response` with the cell's public id (itself in the first generation, where the
        public id is the wire id: a copy cost every response a struct)."""
        if self.generation == 1:
            return response
        return msgspec.structs.replace(response, cell_id=self.public_id(response.cell_id))

    def need(self, capability: str, feature: str) -> None:
        if capability not in self.link.capabilities:
            raise CodeModeError(
                f"code-mode host does not support {feature}: missing `{capability}` capability"
            )

    def outcome(self, result: Ok[Any] | Err, public_id: str) -> WaitOutcome:
        value = unwrap(result, public_id)
        if not isinstance(value, WaitCompleted):
            raise HostLostError("code-mode host returned an invalid cell response")
        outcome = value.outcome
        if self.generation == 1:
            return outcome  # as `response`
        return msgspec.structs.replace(outcome, response=self.response(outcome.response))


def unwrap(result: Ok[Any] | Err, cell_id: str | None = None) -> object:
    """The value of a host's answer, or its error as the exception its kind names (rule 1 of
    `_session`: never by matching text)."""
    if type(result) is _OK:
        return result.value
    if isinstance(result, Err):
        raise error_from_kind(result.kind, result.message, cell_id)
    return result.value
