"""A large tool result, one way (item 9 of issue 10's table): a tool returns one 16 MiB string
and the cell receives it (`const s = await tools.big({}); text(String(s.length))`, timed from
`execute` to `Completed`), against the one-way pipe floor for the same bytes: a 16 MiB msgpack
frame encoded, written to a trio+msgspec child, read and decoded there, a few bytes answered
(`_floors.one_way`). Beside it, without a goal, 100,000 small objects (`{i, s}`) returned the
same way, against the floor for the same objects (msgpack-encoded, decoded by the child). The
in-process provider is shown for reference (no pipe). Goal (issue 10): the string <= 2.5x the floor.

Run: `python -m benchmarks.payload_bench [--quick]` (from the repository's root).
"""

from __future__ import annotations

import collections
import contextlib

import msgspec

from benchmarks import _floors
from benchmarks._cells import BIG_BYTES, OBJECTS, PROVIDERS, Delegate, timed_cell
from benchmarks._measure import MS, Config, Figure, figure, standalone, stats
from codemode import Session

BIG = "const s = await tools.big({}); text(String(s.length));"
MANY = "const o = await tools.objects({}); text(String(o.length));"


async def figures(config: Config) -> list[Figure]:
    runs = config.n(10, 3)
    delegate = Delegate()
    objects = delegate.objects()
    object_bytes = len(msgspec.msgpack.encode(objects))
    big_bytes = b"x" * BIG_BYTES
    samples: dict[str, list[float]] = collections.defaultdict(list)
    async with contextlib.AsyncExitStack() as stack:
        child = await stack.enter_async_context(_floors.open_floor_child())
        sessions: dict[str, Session] = {}
        for name, opener in PROVIDERS.items():
            provider = await stack.enter_async_context(opener())
            sessions[name] = await provider.create_session()
            await timed_cell(sessions[name], BIG, delegate, ["big"])  # warm up
        await _floors.one_way(child, 1, big_bytes)
        for _ in range(runs):  # floors and figures alternate: they share the machine's load
            samples["big floor"] += await _floors.one_way(child, 1, big_bytes)
            samples["many floor"] += await _floors.one_way(child, 1, objects)
            for name, session in sessions.items():
                samples[f"big/{name}"].append(await timed_cell(session, BIG, delegate, ["big"]))
                samples[f"many/{name}"].append(
                    await timed_cell(session, MANY, delegate, ["objects"])
                )
    big_floor = stats(samples["big floor"], MS)
    many_floor = stats(samples["many floor"], MS)
    measured = {
        name: (stats(samples[f"big/{name}"], MS), stats(samples[f"many/{name}"], MS))
        for name in PROVIDERS
    }
    out = []
    for name, (big_stats, _) in measured.items():
        process = name == "process"
        out.append(
            figure(
                f"payload/string/{name}",
                9,
                f"16 MiB string returned by a tool, one way, {name}",
                "ms",
                big_stats,
                big_floor if process else None,
                "one-way pipe: a 16 MiB msgpack frame to a trio+msgspec child" if process else None,
                goal="<= 2.5x floor" if process else None,
            )
        )
    for name, (_, many_stats) in measured.items():
        process = name == "process"
        out.append(
            figure(
                f"payload/objects/{name}",
                9,
                f"{OBJECTS:,} small objects returned by a tool, one way, {name}",
                "ms",
                many_stats,
                many_floor if process else None,
                f"one-way pipe: the same objects as one msgpack frame ({object_bytes:,} B),"
                " decoded by the child"
                if process
                else None,
            )
        )
    return out


if __name__ == "__main__":
    standalone(figures)
