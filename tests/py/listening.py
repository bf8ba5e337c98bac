"""Stopping a test's server thread that sits in accept().

Closing the listening socket is not enough: the thread stays blocked in accept() on the closed
socket, and when that call is interrupted and restarted (a child process of the test ending is
enough) it is restarted with the same fd number, which by then names the next test's listener.
The old thread then accepts that test's connections and answers them from its own table (seen in
CI: the fake docker engine of one test answered the next test's image inspect with its own ID)."""

from __future__ import annotations

import contextlib
import socket
import threading


def stop(listener: socket.socket, thread: threading.Thread) -> None:
    """shutdown() wakes the accept() (EINVAL); the thread is gone before the socket is closed."""
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    thread.join(5)
    listener.close()
    assert not thread.is_alive(), "the server thread did not stop"
