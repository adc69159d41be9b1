"""`ChunkReader`: what the peer sent, read once the descriptor is readable (pipes, sockets) or
through the stream itself (anything else); trio's errors at the end."""

from __future__ import annotations

import os
import socket

import pytest
import trio
import trio.testing

from codemode._trio import ChunkReader
from codemode._trio._reader import SMALL_READ


def pipe() -> tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream]:
    read_fd, write_fd = os.pipe()
    return trio.lowlevel.FdStream(read_fd), trio.lowlevel.FdStream(write_fd)


async def test_a_pipe_gives_what_arrived_then_the_end_of_input() -> None:
    receive, send = pipe()
    reader = ChunkReader(receive, 1 << 20)
    with trio.fail_after(10):
        async with receive:
            await send.send_all(b"first")
            assert await reader.receive_some() == b"first"
            await send.send_all(b"second")
            assert await reader.receive_some() == b"second"
            await send.aclose()
            assert await reader.receive_some() == b""


async def test_a_read_returns_at_most_max_bytes() -> None:
    receive, send = pipe()
    reader = ChunkReader(receive, 4)
    with trio.fail_after(10):
        async with receive, send:
            await send.send_all(b"abcdefgh")
            assert await reader.receive_some() == b"abcd"
            assert await reader.receive_some() == b"efgh"


async def test_a_reader_waits_until_data_arrives() -> None:
    receive, send = pipe()
    reader = ChunkReader(receive, 1 << 20)
    got: list[bytes | bytearray] = []

    async def read() -> None:
        got.append(await reader.receive_some())

    with trio.fail_after(10):
        async with receive, send, trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            await send.send_all(b"late")
    assert got == [b"late"]


async def test_closing_the_stream_under_a_waiting_reader_raises_closed() -> None:
    receive, send = pipe()
    reader = ChunkReader(receive, 1 << 20)
    with trio.fail_after(10):
        async with send, trio.open_nursery() as nursery:

            async def read() -> None:
                with pytest.raises(trio.ClosedResourceError):
                    await reader.receive_some()

            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await receive.aclose()


async def test_a_closed_stream_is_never_read_again() -> None:
    # Its descriptor number may belong to something else by now (rule 1).
    receive, send = pipe()
    reader = ChunkReader(receive, 1 << 20)
    await receive.aclose()
    with trio.fail_after(10):
        async with send:
            with pytest.raises(trio.ClosedResourceError):
                await reader.receive_some()


async def test_a_socket_is_read_directly_too() -> None:
    left, right = trio.socket.socketpair()
    receive, send = trio.SocketStream(left), trio.SocketStream(right)
    reader = ChunkReader(receive, 1 << 20)
    with trio.fail_after(10):
        async with receive:
            await send.send_all(b"over a socket")
            assert await reader.receive_some() == b"over a socket"
            await send.aclose()
            assert await reader.receive_some() == b""


async def test_other_streams_are_read_through_their_own_receive_some() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    reader = ChunkReader(receive, 1 << 20)
    with trio.fail_after(10):
        await send.send_all(b"in memory")
        assert await reader.receive_some() == b"in memory"


async def test_reads_stay_small_until_one_fills_its_size() -> None:
    # Rule 3: a frame of a few hundred bytes must not cost a megabyte's allocation.
    left, right = trio.socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    right.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    receive, send = trio.SocketStream(left), trio.SocketStream(right)
    reader = ChunkReader(receive, 1 << 20)
    payload = b"x" * (512 << 10)
    with trio.fail_after(10):
        async with receive, send:
            await send.send_all(b"small")
            assert await reader.receive_some() == b"small"
            await send.send_all(payload)
            sizes: list[int] = []
            while sum(sizes) < len(payload):
                sizes.append(len(await reader.receive_some()))
    assert sizes[0] == SMALL_READ
    assert max(sizes) > SMALL_READ
