"""`FrameWriter` (codemode._trio): what a connection queued leaves in order, and `run` ends
once closed, also when the close came while nothing was flushed yet."""

from __future__ import annotations

import os
import types

import pytest
import trio
import trio.testing

from codemode._trio import FrameWriter


async def test_close_after_an_unflushed_frame_writes_it_and_ends() -> None:
    # A host that refused a handshake queued the rejection and closed the writer without a
    # flush: the writer wrote it, then waited for a second wake-up that never came, and the
    # host lingered until its 5 s shutdown bound (found by tests/test_fuzz_host.py).
    send, receive = trio.testing.memory_stream_pair()
    queued = [b"rejected"]
    writer = FrameWriter(send, lambda: queued.pop() if queued else b"")
    failures: list[BaseException] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run, failures.append)
            await trio.testing.wait_all_tasks_blocked()
            writer.close()
        assert await receive.receive_some() == b"rejected"
    assert failures == []


async def test_frames_flushed_before_close_leave_in_order() -> None:
    send, receive = trio.testing.memory_stream_pair()
    queued: list[bytes] = []

    def take() -> bytes:
        data = b"".join(queued)
        queued.clear()
        return data

    writer = FrameWriter(send, take)
    failures: list[BaseException] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run, failures.append)
            for chunk in (b"a", b"b", b"c"):
                queued.append(chunk)
                writer.flush()
                await trio.testing.wait_all_tasks_blocked()
            writer.close()
        received = b""
        while len(received) < 3:
            received += await receive.receive_some()
    assert received == b"abc"
    assert failures == []


async def test_frames_queued_in_one_scheduler_pass_leave_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Many cells answering in the same pass of the scheduler used to cost one system call
    # (and one wake-up of the peer) per frame.
    from codemode._trio import _writer

    writes: list[bytes] = []

    def write(fd: int, data: bytes | bytearray) -> int:
        writes.append(bytes(data))
        return os.write(fd, data)

    monkeypatch.setattr(_writer, "os", types.SimpleNamespace(write=write))
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    queued: list[bytes] = []

    def take() -> bytes:
        data = b"".join(queued)
        queued.clear()
        return data

    with trio.fail_after(5), os.fdopen(read_fd, "rb", buffering=0) as reader:
        async with trio.lowlevel.FdStream(write_fd) as send, trio.open_nursery() as nursery:
            writer = FrameWriter(send, take)
            failures: list[BaseException] = []
            nursery.start_soon(writer.run, failures.append)
            await trio.testing.wait_all_tasks_blocked()
            for chunk in (b"a", b"b", b"c"):
                queued.append(chunk)
                writer.flush()
            assert writes == []  # nothing leaves before the pass ends
            await trio.testing.wait_all_tasks_blocked()
            assert writes == [b"abc"]
            assert reader.read(3) == b"abc"
            writer.close()
        assert failures == []
