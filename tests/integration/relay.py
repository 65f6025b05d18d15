"""A TCP relay between a database client and its server, for tests that count what crosses the
wire or cut it at a chosen moment (no helper here is a test). Each accepted connection is
pumped by two threads; a connection's data is never parsed.

* **Round trips**: :attr:`Relay.turns` counts, over every connection, the times a client
  started sending after the server had answered (its first send counts too): the round trips
  of a request-response protocol, pipelined statements counted once.
* **Cuts**: :meth:`Relay.cut_next` arms a cut for the next connection that sends anything:
  ``"before"`` closes both sides without forwarding it (the statements never reach the server);
  ``"after"`` forwards what it sends, drops every answer, and closes the client side a moment
  later (the server ran the statements; their answers are lost).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import List, Optional, Tuple


class Relay:
    """Listens on 127.0.0.1 (a free port: :attr:`port`) and relays to ``target``."""

    def __init__(self, target: Tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.turns = 0
        self.cuts: List[str] = []  # the cuts done, in order
        self._armed: Optional[str] = None
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_next(self, when: str) -> None:
        """Cut the next connection that sends anything (``"before"`` or ``"after"`` its
        statements reach the server; module docstring)."""
        assert when in ("before", "after")
        with self._lock:
            self._armed = when

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            _Pair(self, client, server).start()

    def _take_cut(self) -> Optional[str]:
        with self._lock:
            armed, self._armed = self._armed, None
            if armed is not None:
                self.cuts.append(armed)
            return armed

    def _turn(self) -> None:
        with self._lock:
            self.turns += 1


class _Pair:
    """One relayed connection: a client->server pump and a server->client pump."""

    def __init__(self, relay: Relay, client: socket.socket, server: socket.socket) -> None:
        self.relay = relay
        self.client = client
        self.server = server
        self.answered = True  # the server spoke last: the client's next send is a new turn
        self.dropping = False  # answers are dropped (cut "after")

    def start(self) -> None:
        threading.Thread(target=self._upstream, daemon=True).start()
        threading.Thread(target=self._downstream, daemon=True).start()

    def _upstream(self) -> None:
        while True:
            data = _recv(self.client)
            if not data:
                _close(self.server)
                return
            if self.answered:
                self.answered = False
                self.relay._turn()
                cut = self.relay._take_cut()
                if cut == "before":
                    _close(self.client)
                    _close(self.server)
                    return
                if cut == "after":
                    self.dropping = True
                    threading.Timer(0.5, _close, (self.client,)).start()
            try:
                self.server.sendall(data)
            except OSError:
                _close(self.client)
                return

    def _downstream(self) -> None:
        while True:
            data = _recv(self.server)
            if not data:
                _close(self.client)
                return
            self.answered = True
            if self.dropping:
                continue
            try:
                self.client.sendall(data)
            except OSError:
                _close(self.server)
                return


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


__all__ = ["Relay"]
