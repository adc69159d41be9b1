"""The cell state tables of the runtime (h11 `_state.py`; design.md, style 4).

A cell has three independent parts of state, each a table applied by `StateTable.move`:

*Lifecycle* (`LIFECYCLE`): where the cell's JavaScript and its completion stand.

    RUNNING ──js finished──> DRAINING ──drained──> COMPLETED ──claim──> CLAIMED ──close──> CLOSED
       │                        │                      │
       └──terminate─────────────┴──> TERMINATING ──cleaned up──> TERMINATED ──close──> CLOSED

  DRAINING delivers the notifications in flight and cancels the tool calls still pending; the
  stored values are committed on `drained`. COMPLETED holds the completion until an observer
  or a terminate claims it (a shutdown claims it too, and drops it). Any state may `abort` to
  CLOSED: the cell's task ended early (the engine closed, the provider's nursery was cancelled).

*Observation* (`OBSERVATION`): who watches the cell. One observer at a time.

    IDLE ──attach──> WATCHING ──boundary──> YIELDING
      ^                 │                      │
      └────detach───────┴──────detach──────────┘

  YIELDING means the observer must answer with the output before its boundary (its window
  ended, or `yield_control()` ran); delegate calls the cell makes while an observer is YIELDING
  are started once it answered, so the observer's response leaves before them (the order the
  reference's hosts keep on the wire, design.md, host 2.5).

*Initial observation* (`INITIAL`): the observation `execute` attached, which belongs to the
`StartedCell`: PENDING until it is taken (AWAITED) or answered at once or released (DONE).
"""

from __future__ import annotations

import enum

from codemode.protocol import StateTable


class Lifecycle(enum.Enum):
    RUNNING = "running"
    DRAINING = "draining notifications"
    COMPLETED = "completed"
    CLAIMED = "completed, claimed"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    CLOSED = "closed"


class LifecycleTrigger(enum.Enum):
    JS_FINISHED = "js finished"
    DRAINED = "drained"
    CLAIM = "claim"
    TERMINATE = "terminate"
    CLEANED_UP = "cleaned up"
    CLOSE = "close"
    ABORT = "abort"


LIFECYCLE: StateTable[Lifecycle, LifecycleTrigger] = StateTable(
    "runtime cell",
    {
        Lifecycle.RUNNING: {
            LifecycleTrigger.JS_FINISHED: Lifecycle.DRAINING,
            LifecycleTrigger.TERMINATE: Lifecycle.TERMINATING,
            LifecycleTrigger.ABORT: Lifecycle.CLOSED,
        },
        Lifecycle.DRAINING: {
            LifecycleTrigger.DRAINED: Lifecycle.COMPLETED,
            LifecycleTrigger.TERMINATE: Lifecycle.TERMINATING,
            LifecycleTrigger.ABORT: Lifecycle.CLOSED,
        },
        Lifecycle.COMPLETED: {
            LifecycleTrigger.CLAIM: Lifecycle.CLAIMED,
            LifecycleTrigger.ABORT: Lifecycle.CLOSED,
        },
        Lifecycle.CLAIMED: {
            LifecycleTrigger.CLOSE: Lifecycle.CLOSED,
            LifecycleTrigger.ABORT: Lifecycle.CLOSED,
        },
        Lifecycle.TERMINATING: {
            LifecycleTrigger.CLEANED_UP: Lifecycle.TERMINATED,
            LifecycleTrigger.ABORT: Lifecycle.CLOSED,
        },
        Lifecycle.TERMINATED: {
            LifecycleTrigger.CLOSE: Lifecycle.CLOSED,
            LifecycleTrigger.ABORT: Lifecycle.CLOSED,
        },
        Lifecycle.CLOSED: {},
    },
)


class Watch(enum.Enum):
    IDLE = "idle"
    WATCHING = "watching"
    YIELDING = "yielding"


ACTIVE = (Lifecycle.RUNNING, Lifecycle.DRAINING, Lifecycle.TERMINATING)
"""The states that hold an active-cell slot (`_admission`): the cell's JavaScript or its
cleanup still runs. A completion waiting to be collected holds none. (A tuple: its `in`
compares identities, where a set's would call the members' Python-level `__hash__`.)"""


class WatchTrigger(enum.Enum):
    ATTACH = "attach"
    BOUNDARY = "boundary"
    DETACH = "detach"


OBSERVATION: StateTable[Watch, WatchTrigger] = StateTable(
    "runtime cell observation",
    {
        Watch.IDLE: {WatchTrigger.ATTACH: Watch.WATCHING},
        Watch.WATCHING: {WatchTrigger.BOUNDARY: Watch.YIELDING, WatchTrigger.DETACH: Watch.IDLE},
        Watch.YIELDING: {WatchTrigger.BOUNDARY: Watch.YIELDING, WatchTrigger.DETACH: Watch.IDLE},
    },
)


class Initial(enum.Enum):
    """Where a cell's initial observation stands (rule 5 of `_cell`): neither awaited nor
    released yet, awaited, or done with (answered, released or cancelled)."""

    PENDING = "pending"
    AWAITED = "awaited"
    DONE = "done"


class InitialTrigger(enum.Enum):
    TAKE = "take"
    ANSWER = "answer"
    RELEASE = "release"


INITIAL: StateTable[Initial, InitialTrigger] = StateTable(
    "runtime initial observation",
    {
        Initial.PENDING: {
            InitialTrigger.TAKE: Initial.AWAITED,
            InitialTrigger.ANSWER: Initial.DONE,  # answered at once, without a task
            InitialTrigger.RELEASE: Initial.DONE,
        },
        Initial.AWAITED: {InitialTrigger.ANSWER: Initial.DONE},
    },
)
