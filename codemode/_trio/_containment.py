"""Which exceptions of a delegate call stay inside that call.

A delegate (a tool, a notification handler, `cell_closed`) is the application's code, and a
cell's call of it fails alone: whatever the call raises rejects that call (its JavaScript
promise), and nothing else ends. `SystemExit` (argparse and click on bad input),
`KeyboardInterrupt` a tool raised itself, `asyncio.CancelledError` out of `asyncio.run` inside a
sync tool, and a `trio.Cancelled` that belongs to no cancelled scope around the call (a stray
one) are all just a failed call.

Rules:
1. Not contained, and so re-raised: the call's own cancellation, a `trio.Cancelled` (or a group
   of nothing else) raised while a scope around the call is cancelled. Everything else is
   contained.
2. A real Ctrl-C never surfaces inside a delegate: the workers run with trio's
   KeyboardInterrupt protection (`CallWorkers`), so trio delivers it to the main task.
3. A delegate that `codemode.aio` runs on the asyncio loop is cancelled the asyncio way: its own
   cancellation is an `asyncio.CancelledError` raised while its task is being cancelled, and is
   not contained either.
"""

from __future__ import annotations

import math
import sys

import trio


def contained(error: BaseException) -> bool:
    """Whether `error`, raised by a delegate call, ends only that call (rules 1 and 3)."""
    if _asyncio_cancellation(error):
        return False
    if not cancellation(error):
        return True
    return trio.current_effective_deadline() != -math.inf


def _asyncio_cancellation(error: BaseException) -> bool:
    asyncio = sys.modules.get("asyncio")  # never imported: then no asyncio task runs this
    if asyncio is None or not isinstance(error, asyncio.CancelledError):
        return False
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return False  # no asyncio loop runs here: a stray one, raised by a trio delegate
    return task is not None and task.cancelling() > 0


def cancellation(error: BaseException) -> bool:
    """Whether `error` is a `trio.Cancelled`, or a group of nothing else."""
    if isinstance(error, BaseExceptionGroup):
        return all(cancellation(inner) for inner in error.exceptions)
    return isinstance(error, trio.Cancelled)
