"""A squatter for the tests of the barrier and the relay: something that is not ours, holding a
TCP port on 127.0.0.1 that one of our candidates derives to."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

BANNER = b"SSH-2.0-OpenSSH_9.2\r\n"


def silent(_sock: socket.socket) -> None:
    """Accepts and says nothing."""


def banner(sock: socket.socket) -> None:
    sock.sendall(BANNER)


@contextlib.contextmanager
def squatter(answer: Callable[[socket.socket], None], port: int = 0) -> Iterator[int]:
    """Listen on `port` (0: any); every connection gets `answer(sock)` and is held open until the
    block ends, as a process that never lets go would. Yields the port."""
    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(0.2)
    stop = threading.Event()

    def run() -> None:
        held = []
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                continue
            held.append(sock)
            try:
                answer(sock)
            except OSError:
                pass
        for sock in held:
            sock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()
