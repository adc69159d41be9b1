"""`FrameWriter` (codemode._trio): what a connection queued leaves in order, and `run` ends
once closed, also when the close came while nothing was flushed yet."""

from __future__ import annotations

import fcntl
import os

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


async def test_the_first_frame_of_a_pass_leaves_at_once_and_the_rest_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Many cells answering in the same pass of the scheduler used to cost one system call
    # (and one wake-up of the peer) per frame; deferring them all made a lone frame wait for
    # the rest of its pass.
    # os.write itself, not the module's name for it: a compiled `_writer` (docs/compiled.md)
    # holds the module `os`, and looks `write` up on it at each call.
    real_write = os.write
    writes: list[bytes] = []

    def write(fd: int, data: bytes | bytearray) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
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
            for chunk in (b"a", b"b", b"c", b"d"):
                queued.append(chunk)
                writer.flush()
            assert writes == [b"a"]  # the pass's first frame left at once
            await trio.testing.wait_all_tasks_blocked()
            assert writes == [b"a", b"bcd"]  # the rest when the pass ended
            assert reader.read(4) == b"abcd"
            writer.close()
        assert failures == []


async def test_what_a_full_pipe_did_not_take_leaves_without_other_wakeups() -> None:
    # What the end-of-pass write leaves behind goes through the writer task. (Waking that
    # task from the hook with a plain event once left both ends of a wire asleep: trio had
    # chosen how long to sleep before it called the hook. tests/test_limits.py's output loop
    # over the process provider caught it.)
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(write_fd, False)
    payload = os.urandom(1 << 20)
    queued = [payload]

    def read_all() -> bytes:
        received = bytearray()
        with os.fdopen(read_fd, "rb", buffering=0) as reader:
            while len(received) < len(payload):
                received += reader.read(len(payload) - len(received))
        return bytes(received)

    failures: list[BaseException] = []
    received: list[bytes] = []
    with trio.fail_after(10):
        async with trio.lowlevel.FdStream(write_fd) as send, trio.open_nursery() as nursery:
            writer = FrameWriter(send, lambda: queued.pop() if queued else b"")

            async def read_then_close() -> None:
                received.append(await trio.to_thread.run_sync(read_all))
                writer.close()

            nursery.start_soon(writer.run, failures.append)
            nursery.start_soon(read_then_close)
            await trio.testing.wait_all_tasks_blocked()
            writer.flush()
    assert received == [payload]
    assert failures == []


async def test_a_handed_over_buffer_is_written_without_a_copy_and_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A connection hands its outgoing bytearray over (`Endpoint.take_outgoing`): a 16 MiB tool
    # result was copied three times on its way out before. Frames queued while the writer task
    # is still writing the big one follow it.
    # os.write itself, not the module's name for it: a compiled `_writer` (docs/compiled.md)
    # holds the module `os`, and looks `write` up on it at each call.
    real_write = os.write
    buffers: list[object] = []

    def write(fd: int, data: bytes | bytearray) -> int:
        buffers.append(data)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(write_fd, False)
    big = bytearray(os.urandom(1 << 20))
    queued: list[bytearray] = []

    def take() -> bytearray:
        return queued.pop(0) if queued else bytearray()

    def read_all(size: int) -> bytes:
        received = bytearray()
        with os.fdopen(read_fd, "rb", buffering=0) as reader:
            while len(received) < size:
                received += reader.read(size - len(received))
        return bytes(received)

    expected = bytes(big) + b"after-1" + b"after-2"
    failures: list[BaseException] = []
    received: list[bytes] = []
    with trio.fail_after(10):
        async with trio.lowlevel.FdStream(write_fd) as send, trio.open_nursery() as nursery:
            writer = FrameWriter(send, take)

            async def read_then_close() -> None:
                received.append(await trio.to_thread.run_sync(read_all, len(expected)))
                writer.close()

            nursery.start_soon(writer.run, failures.append)
            await trio.testing.wait_all_tasks_blocked()
            queued.append(big)
            writer.flush()  # the pass's first write: straight from the handed-over buffer
            assert buffers[0] is big
            for frame in (b"after-1", b"after-2"):  # queued behind what the pipe did not take
                queued.append(bytearray(frame))
                writer.flush()
                await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(read_then_close)
    assert received == [expected]
    assert failures == []
