"""What the host answers a request with when its work raised, and the host's time on a
response (`host_duration`): the pieces `_requests.py` builds its answers from."""

from __future__ import annotations

import logging
import time
from typing import TypeVar

import msgspec

from codemode import CodeModeError, Completed, Pending, Terminated, WaitOutcome, Yielded
from codemode.errors import ErrorKind, error_kind
from codemode.protocol import Err, HostResponse, Ok, WaitCompleted

logger = logging.getLogger("codemode.host")


def failed(error: Exception, what: str, request_id: int) -> Err:
    """The answer to a request whose work raised `error`: a codemode error's own kind, else an
    internal error, logged with its traceback (call it from the `except` block)."""
    if isinstance(error, CodeModeError):
        return Err(kind=error_kind(error), message=str(error))
    logger.exception("code-mode %s %s failed", what, request_id)
    return Err(kind=ErrorKind.INTERNAL, message=f"code-mode request task failed: {error}")


_Response = TypeVar("_Response", bound=Yielded | Completed | Terminated | Pending)


def timed(response: _Response, started: float) -> _Response:
    """`response` with the host's time on it since `started` (`time.perf_counter()`)."""
    return msgspec.structs.replace(response, host_duration=time.perf_counter() - started)


def timed_completion(outcome: WaitOutcome, started: float) -> Ok[HostResponse]:
    """The answer of a wait or a terminate that observed `outcome`, timed."""
    timed_outcome = msgspec.structs.replace(outcome, response=timed(outcome.response, started))
    return Ok(value=WaitCompleted(outcome=timed_outcome))
