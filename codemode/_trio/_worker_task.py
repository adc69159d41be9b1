"""The body of a call worker's task (`_callbacks.py`, rules 1-3, 5 and 7): the one part of the call
workers that stays interpreted when the build compiles the rest.

trio's KeyboardInterrupt protection marks the code object of the function it protects, and
looks for it among the frames of the running code; a function mypyc compiles has neither. This
loop is an ordinary Python function, protected, and the compiled calls it makes add no frame
between it and the delegate's code, which therefore runs protected too (rule 5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ._callbacks import CallWorkers, Job


@trio.lowlevel.enable_ki_protection  # rule 5
async def work(workers: CallWorkers, first: Job) -> None:
    """Run `first`, then park for the next job until `workers` retire this worker."""
    with trio.CancelScope() as scope:
        worker = workers.enlist(trio.lowlevel.current_task(), scope)
        job: Job | None = first
        del first
        while job is not None:
            await job.run(worker)
            job = None  # a parked worker keeps nothing of its last job (rule 6)
            if not workers.keeps(worker):
                return  # rule 2, rule 3
            job = await workers.park(worker)
