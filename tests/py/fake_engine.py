"""A docker engine on a unix socket for the tests of what asks it directly (slurm_multi.dockerapi's
callers): each `GET <url>` is answered from a table, 404 for anything else."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import listening

OK = b"HTTP/1.1 200 OK"
NOT_FOUND = (b"HTTP/1.1 404 Not Found", b'{"message":"No such image"}')


class Engine:
    """The server: `close()` stops its thread first (listening.stop)."""

    def __init__(self, server: socket.socket, thread: threading.Thread) -> None:
        self._server, self._thread = server, thread

    def close(self) -> None:
        listening.stop(self._server, self._thread)


def engine(tmp_path: Path, answers: dict[str, bytes | tuple[bytes, bytes]]) -> tuple[str, Engine]:
    """The socket's path and its server (close it to stop). An answer is a body (200 OK) or a
    (status line, body) pair."""
    path = str(tmp_path / "engine.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                url = conn.recv(4096).split(b" ")[1].decode()
                answer = answers.get(url, NOT_FOUND)
                head, body = (OK, answer) if isinstance(answer, bytes) else answer
                conn.sendall(head + b"\r\n\r\n" + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return path, Engine(server, thread)
