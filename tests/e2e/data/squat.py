"""A squatter without the job token, for the end-to-end tests: listens on the given ports of every
address of this node and answers each connection like one of our servers would, but unsigned:
`relay` greets like a relay parent and then DENYs; `barrier` sends a CHALLENGE and then a GO no
token signed. It holds every connection open until killed.

Usage: python3 squat.py relay|barrier PORT [PORT...]
"""

import secrets
import selectors
import socket
import sys


def main() -> int:
    mode, ports = sys.argv[1], [int(port) for port in sys.argv[2:]]
    sel = selectors.DefaultSelector()
    for port in ports:
        listener = socket.create_server(("0.0.0.0", port), reuse_port=False)
        sel.register(listener, selectors.EVENT_READ, "listener")
    print("listening", *ports, flush=True)
    held = []
    while True:
        for key, _ in sel.select():
            if key.data == "listener":
                sock, _ = key.fileobj.accept()
                held.append(sock)
                greeting = "SM-RELAY/1 HELLO" if mode == "relay" else "CHALLENGE"
                sock.sendall(f"{greeting} {secrets.token_hex(16)}\n".encode())
                sel.register(sock, selectors.EVENT_READ, "peer")
                continue
            sock = key.fileobj
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                sel.unregister(sock)
                continue
            if mode == "relay":
                sock.sendall(b"DENY wrong token\n")
            else:
                sock.sendall(f"GO {'0' * 64} 1 sha256:{'e' * 64}\n".encode())


if __name__ == "__main__":
    sys.exit(main())
