"""The workers' output channel (frames.py) over real Unix sockets: frames arrive whole
and in order however the stream splits them, a full socket blocks the writer until the
reader reads, and the writer gives up on a reader that closed or stopped reading."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path

import pytest

from inferflux.engine.frames import MAX_FRAME_BYTES, ChannelClosed, FrameReader, FrameWriter, frame


class _Collect:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def __call__(self, payload: bytes) -> None:
        self.frames.append(bytes(payload))


def test_reader_reassembles_frames_however_the_stream_splits_them() -> None:
    payloads = [b"", b"a", os.urandom(3), os.urandom(70_000), b"last"]
    stream = b"".join(frame(p) for p in payloads)
    for chunk_size in (1, 3, 4, 5, 1024, len(stream)):
        collect = _Collect()
        reader = FrameReader(collect)
        for start in range(0, len(stream), chunk_size):
            reader.data_received(stream[start : start + chunk_size])
        assert collect.frames == payloads, chunk_size


def test_a_failing_handler_skips_only_its_frame(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[bytes] = []

    def handle(payload: bytes) -> None:
        if payload == b"bad":
            raise ValueError("cannot decode")
        seen.append(payload)

    reader = FrameReader(handle)
    reader.data_received(frame(b"one") + frame(b"bad") + frame(b"two"))
    assert seen == [b"one", b"two"]
    assert "could not be handled" in caplog.text


class _FakeTransport(asyncio.Transport):
    """A fake transport: records that the reader closed it."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_frame_longer_than_the_limit_closes_the_connection() -> None:
    collect = _Collect()
    reader = FrameReader(collect)
    transport = _FakeTransport()
    reader.connection_made(transport)
    reader.data_received((MAX_FRAME_BYTES + 1).to_bytes(4, "little") + b"xx")
    assert transport.closed
    assert collect.frames == []


def _listener(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "out.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    return server, path


def _read_frames(conn: socket.socket, count: int) -> list[bytes]:
    collect = _Collect()
    reader = FrameReader(collect)
    while len(collect.frames) < count:
        data = conn.recv(65536)
        if not data:
            break
        reader.data_received(data)
    return collect.frames


def test_writer_blocks_on_a_full_socket_and_every_frame_arrives_whole(tmp_path: Path) -> None:
    server, path = _listener(tmp_path)
    writer = FrameWriter(path, gone=lambda: False, poll_s=0.05)
    conn, _ = server.accept()
    payloads = [os.urandom(200_000) for _ in range(20)]  # 4 MB: far over the socket buffer
    sender = threading.Thread(target=lambda: [writer.send(p) for p in payloads])
    sender.start()
    received = _read_frames(conn, len(payloads))
    sender.join(10)
    assert not sender.is_alive()
    assert received == payloads
    writer.close()
    conn.close()
    server.close()


def test_writer_raises_once_the_reader_closed(tmp_path: Path) -> None:
    server, path = _listener(tmp_path)
    writer = FrameWriter(path, gone=lambda: False, poll_s=0.05)
    conn, _ = server.accept()
    conn.close()
    with pytest.raises(ChannelClosed):
        for _ in range(100):  # the first sends may still fit in the socket buffer
            writer.send(os.urandom(100_000))
    writer.close()
    server.close()


@pytest.mark.parametrize(
    ("reader_gone", "give_up_s"),
    [(True, 30.0), (False, 0.2)],
    ids=["reader-process-gone", "deadline-passed"],
)
def test_writer_gives_up_on_a_reader_that_stopped_reading(
    tmp_path: Path, reader_gone: bool, give_up_s: float
) -> None:
    """Accepted, never read: the writer stops once `gone()` says so, or at its deadline
    even while the reader lives."""
    server, path = _listener(tmp_path)
    writer = FrameWriter(path, gone=lambda: reader_gone, poll_s=0.05, give_up_s=give_up_s)
    conn, _ = server.accept()
    with pytest.raises(ChannelClosed, match="too long"):
        for _ in range(1000):
            writer.send(os.urandom(100_000))
    writer.close()
    conn.close()
    server.close()


def test_frames_reach_an_asyncio_unix_server_in_order(tmp_path: Path) -> None:
    path = str(tmp_path / "out.sock")
    payloads = [f"message {i}".encode() * (i + 1) for i in range(200)]

    async def main() -> list[bytes]:
        collect = _Collect()
        server = await asyncio.get_running_loop().create_unix_server(
            lambda: FrameReader(collect), path=path
        )
        writer = await asyncio.to_thread(FrameWriter, path, lambda: False)
        await asyncio.to_thread(lambda: [writer.send(p) for p in payloads])
        for _ in range(200):
            if len(collect.frames) == len(payloads):
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()
        return collect.frames

    assert asyncio.run(main()) == payloads
