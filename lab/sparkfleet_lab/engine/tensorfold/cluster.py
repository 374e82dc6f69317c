"""The ranks' rendezvous and data plane, in place of torch's TCPStore and NCCL.

Real (ashhart/TensorFold src/tensorfold/cuda/comm.py; sfxnz's deepseek_v41 engine.py, protocol.py):
rank 0 opens a TCPStore on --master-port and waits up to 600 s for every other rank; the others
connect to --master:--master-port and wait up to 600 s for it; then NCCL. The ranks gather each
rank's startup settings and refuse to serve, naming both values, when they differ; they finish
loading together (a rank still loading after a minute is named every minute); then rank 0 serves and
the others follow it: each request crosses as a header and the prompt, and every rank runs it.

Here one TCP connection per worker to --master:--master-port carries all of it (JSON lines): the
join with the worker's settings, rank 0's table of every rank's settings, the loading barrier,
then each request (every rank takes part: its reply is checked) and a heartbeat each second while
idle. A worker that loses rank 0 raises (its process exits 1 with a traceback, as a real rank whose
store connection breaks); a lost worker makes rank 0's requests fail, and rank 0 keeps serving errors.
A formed cluster takes no new member (a real communicator cannot be joined again): restart rank 0.
SPARKFLEET_LAB_ENGINE_RENDEZVOUS_S (the lab's knob) shortens the 600 s wait for tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_LINE = 64 << 20
HEARTBEAT_S = 1.0
CALL_TIMEOUT_S = 30.0
WORKER_IDLE_S = 10.0  # a worker that hears nothing from rank 0 for this long has lost it
READY_EVERY_S = 60.0  # a rank waiting for the others to finish loading says so this often
RENDEZVOUS_ENV = "SPARKFLEET_LAB_ENGINE_RENDEZVOUS_S"
RENDEZVOUS_S = 600.0

Log = Callable[[str], None]


def rendezvous_timeout(environ=os.environ) -> float:
    raw = environ.get(RENDEZVOUS_ENV, "")
    try:
        return float(raw) if raw else RENDEZVOUS_S
    except ValueError:
        raise ValueError(f"{RENDEZVOUS_ENV}={raw}: a number of seconds") from None


class RankLost(RuntimeError):
    """A request cannot run: a rank is gone (rank 0 keeps serving errors)."""


def send(sock: socket.socket, obj: dict) -> None:
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


class Lines:
    """A socket's messages, one per line. A read that times out keeps what it got, so the next read goes on
    (a socket's makefile() reader refuses every read after a timeout: "cannot read from timed out object",
    which a TCPStore client waiting at a rendezvous never says)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def readline(self, limit: int) -> bytes:
        while True:
            end = self.buf.find(b"\n", 0, limit)
            if end >= 0 or len(self.buf) >= limit:
                cut = end + 1 if end >= 0 else limit
                line = bytes(self.buf[:cut])
                del self.buf[:cut]
                return line
            data = self.sock.recv(1 << 16)  # TimeoutError: the buffer stays as it is
            if not data:  # closed: what is left (a cut message), then b""
                line = bytes(self.buf)
                self.buf.clear()
                return line
            self.buf += data


def recv(reader, what: str) -> dict:
    line = reader.readline(MAX_LINE)
    if not line:
        raise ConnectionError(f"{what}: connection closed")
    if not line.endswith(b"\n"):
        raise ConnectionError(f"{what}: message too long or cut")
    msg = json.loads(line)
    if not isinstance(msg, dict):
        raise ConnectionError(f"{what}: not a message")
    return msg


def part(payload: str, rank: int) -> int:
    """What each rank contributes to a request (rank 0 knows what to expect)."""
    return int.from_bytes(hashlib.sha256(f"{rank}|{payload}".encode()).digest()[:4], "big")


@dataclass
class Peer:
    rank: int
    address: str
    sock: socket.socket
    reader: object
    join: dict
    lock: threading.Lock = field(default_factory=threading.Lock)
    alive: bool = True
    error: str = ""

    def call(self, msg: dict, timeout: float = CALL_TIMEOUT_S) -> dict:
        with self.lock:
            if not self.alive:
                raise RankLost(self.error)
            try:
                self.sock.settimeout(timeout)
                send(self.sock, msg)
                return recv(self.reader, f"rank {self.rank}")
            except (OSError, ValueError) as exc:
                why = f"no answer within {timeout:.0f} s" if isinstance(exc, TimeoutError) else str(exc)
                self.lost(f"rank {self.rank} ({self.address}) was lost: {why}")
                raise RankLost(self.error) from exc

    def lost(self, why: str) -> None:
        if self.alive:
            self.alive, self.error = False, why
            with contextlib.suppress(OSError):
                self.sock.close()


class Coordinator:
    """Rank 0: the rendezvous on --master-port, the settings table, the loading barrier, the requests."""

    def __init__(self, *, world: int, port: int, log: Log, timeout: float) -> None:
        self.world, self.port, self.log, self.timeout = world, port, log, timeout
        self.cond = threading.Condition()
        self.peers: dict[int, Peer] = {}
        self.formed = False
        self.stopping = False
        self._server: socket.socket | None = None

    def start(self) -> None:
        try:  # a TCPStore server listens on every interface
            self._server = socket.create_server(("0.0.0.0", self.port))  # noqa: S104 - the rendezvous port
        except OSError as exc:
            raise RuntimeError(f"the rendezvous store cannot listen on port {self.port}: {exc}") from exc
        threading.Thread(target=self._accept, name="rendezvous", daemon=True).start()

    def _accept(self) -> None:
        assert self._server is not None
        while not self.stopping:
            try:
                conn, addr = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._join, args=(conn, addr), daemon=True).start()

    def _refuse(self, conn: socket.socket, why: str) -> None:
        self.log(f"[tensorfold] rendezvous refused: {why}")
        with contextlib.suppress(OSError):
            send(conn, {"op": "refused", "error": why})
        conn.close()

    def _join(self, conn: socket.socket, addr: tuple) -> None:
        reader = Lines(conn)
        try:
            conn.settimeout(10)
            msg = recv(reader, "join")
        except (OSError, ValueError):
            conn.close()
            return
        rank, world = msg.get("rank"), msg.get("world")
        where = f"rank {rank} from {addr[0]}"
        if world != self.world:
            return self._refuse(conn, f"{where} was started with --tp {world}; rank 0 has --tp {self.world}")
        if not isinstance(rank, int) or not 0 < rank < self.world:
            return self._refuse(conn, f"{where} is not a worker rank of --tp {self.world}")
        with self.cond:
            if self.formed or self.stopping:
                why = f"{where} cannot join a formed cluster; restart rank 0 to form it again"
            elif rank in self.peers and self.peers[rank].alive:
                why = f"{where} joined twice (two machines with the same --rank?)"
            else:
                why = ""
                conn.settimeout(None)
                self.peers[rank] = Peer(rank, addr[0], conn, reader, msg)
                self.cond.notify_all()
        if why:
            self._refuse(conn, why)

    def wait_joined(self, stop: threading.Event) -> dict[int, dict]:
        """Every worker's join (its settings); RuntimeError after the rendezvous timeout."""
        deadline = time.monotonic() + self.timeout
        with self.cond:
            while True:
                missing = [r for r in range(1, self.world) if r not in self.peers or not self.peers[r].alive]
                if not missing:
                    return {r: p.join for r, p in self.peers.items()}
                if stop.is_set():
                    raise KeyboardInterrupt
                left = deadline - time.monotonic()
                if left <= 0:
                    joined = self.world - len(missing)
                    raise RuntimeError(
                        f"timed out after {self.timeout:.0f} s waiting for the other ranks at the rendezvous "
                        f"(port {self.port}): {joined}/{self.world} ranks joined, rank(s) "
                        f"{', '.join(map(str, missing))} did not"
                    )
                self.cond.wait(min(left, 0.5))

    def broadcast(self, msg: dict) -> None:
        for peer in list(self.peers.values()):
            try:
                send(peer.sock, msg)
            except OSError as exc:
                raise RuntimeError(f"rank {peer.rank} ({peer.address}) left during startup: {exc}") from exc

    def barrier(self, label: str, stop: threading.Event) -> None:
        """Every worker says `label`; rank 0 names the ones it still waits for every minute."""
        started = time.monotonic()
        pending = dict(self.peers)
        results: dict[int, object] = {}

        def wait_for(peer: Peer) -> None:
            try:
                msg = recv(peer.reader, f"rank {peer.rank}")
                results[peer.rank] = msg if msg.get("op") == label else f"said {msg.get('op')!r}"
            except (OSError, ValueError) as exc:
                results[peer.rank] = str(exc)

        threads = {r: threading.Thread(target=wait_for, args=(p,), daemon=True) for r, p in pending.items()}
        for t in threads.values():
            t.start()
        next_note = READY_EVERY_S
        while any(t.is_alive() for t in threads.values()):
            if stop.wait(0.2):
                raise KeyboardInterrupt
            waited = time.monotonic() - started
            if waited >= next_note:
                missing = ", ".join(str(r) for r, t in threads.items() if t.is_alive())
                self.log(f"[tensorfold] rank 0 finished {label}; waiting for rank {missing} ({waited:.0f} s)")
                next_note += READY_EVERY_S
        for rank, got in sorted(results.items()):
            if not isinstance(got, dict):
                raise RuntimeError(f"rank {rank} ({self.peers[rank].address}) failed while {label}: {got}")
        with self.cond:
            self.formed = True
        for peer in self.peers.values():
            send(peer.sock, {"op": "go"})
            threading.Thread(
                target=self._heartbeat, args=(peer,), name=f"heartbeat-{peer.rank}", daemon=True
            ).start()

    def _heartbeat(self, peer: Peer) -> None:
        while peer.alive and not self.stopping:
            with contextlib.suppress(RankLost):
                if peer.call({"op": "ping"}).get("op") != "pong":
                    peer.lost(f"rank {peer.rank} ({peer.address}) answered a heartbeat wrongly")
            time.sleep(HEARTBEAT_S)

    def lost(self) -> list[str]:
        return [p.error for p in self.peers.values() if not p.alive]

    def run(self, request: dict) -> None:
        """One request on every worker (each checks its state and returns its part)."""
        for peer in sorted(self.peers.values(), key=lambda p: p.rank):
            reply = peer.call({"op": "request", **request})
            if not reply.get("ok"):
                raise RuntimeError(
                    f"rank {peer.rank} ({peer.address}) failed the request: {reply.get('error')}"
                )
            if reply.get("part") != part(request["id"], peer.rank):
                peer.lost(f"rank {peer.rank} ({peer.address}) returned a wrong part")
                raise RankLost(peer.error)

    def stop(self, note: dict | None = None) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for peer in list(self.peers.values()):
            if peer.alive:
                with contextlib.suppress(RankLost):
                    peer.call({"op": "stop", **(note or {})}, timeout=10)
                peer.lost("stopped")
        if self._server is not None:
            self._server.close()


class Worker:
    """A rank other than 0: joins rank 0, then follows it."""

    def __init__(self, *, rank: int, world: int, master: str, port: int, log: Log, timeout: float) -> None:
        self.rank, self.world, self.master, self.port = rank, world, master, port
        self.log, self.timeout = log, timeout
        self.sock: socket.socket | None = None
        self.reader = None

    def join(self, hello: dict, stop: threading.Event) -> dict:
        """Connect (rank 0 may start later), send `hello`; -> rank 0's settings table."""
        where = f"{self.master}:{self.port}"
        deadline = time.monotonic() + self.timeout
        while True:
            if stop.is_set():
                raise KeyboardInterrupt
            try:
                self.sock = socket.create_connection((self.master, self.port), timeout=3)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"timed out after {self.timeout:.0f} s reaching the rendezvous store at {where}: "
                        f"{exc}"
                    ) from exc
                stop.wait(1.0)
        self.reader = Lines(self.sock)
        send(self.sock, {"op": "join", "rank": self.rank, "world": self.world, **hello})
        while True:  # rank 0 answers once every rank joined
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"timed out after {self.timeout:.0f} s waiting at the rendezvous store at {where}"
                )
            self.sock.settimeout(min(left, 1.0))
            try:
                msg = recv(self.reader, "rank 0")
                break
            except TimeoutError:
                if stop.is_set():
                    raise KeyboardInterrupt from None
            except (OSError, ValueError) as exc:
                raise RuntimeError(f"the rendezvous store at {where} went away: {exc}") from exc
        if msg.get("op") == "refused":
            raise RuntimeError(f"rank 0 at {where} refused this rank: {msg.get('error')}")
        if msg.get("op") != "settings":
            raise RuntimeError(f"rank 0 at {where} said {msg.get('op')!r}, not the settings")
        self.sock.settimeout(None)
        return msg

    def loaded(self, stop: threading.Event) -> None:
        """Say this rank finished loading; wait until every rank did."""
        assert self.sock is not None
        send(self.sock, {"op": "loading"})
        started, next_note = time.monotonic(), READY_EVERY_S
        self.sock.settimeout(0.5)
        while True:
            try:
                msg = recv(self.reader, "rank 0")
                break
            except TimeoutError:
                if stop.is_set():
                    raise KeyboardInterrupt from None
                waited = time.monotonic() - started
                if waited >= next_note:
                    self.log(
                        f"[tensorfold] rank {self.rank} finished loading; waiting for rank 0 ({waited:.0f} s)"
                    )
                    next_note += READY_EVERY_S
            except (OSError, ValueError) as exc:
                raise RuntimeError(f"lost rank 0 at {self.master}:{self.port} while loading: {exc}") from exc
        if msg.get("op") != "go":
            raise RuntimeError(f"rank 0 said {msg.get('op')!r} instead of starting")

    def follow(self, handle: Callable[[dict], None], on_stop: Callable[[dict], None]) -> None:
        """Answer rank 0 until it says stop; RuntimeError when rank 0 is lost."""
        assert self.sock is not None
        self.sock.settimeout(WORKER_IDLE_S)
        where = f"{self.master}:{self.port}"
        while True:
            try:
                msg = recv(self.reader, "rank 0")
            except TimeoutError as exc:
                raise RuntimeError(f"lost rank 0 at {where}: nothing for {WORKER_IDLE_S:.0f} s") from exc
            except (OSError, ValueError) as exc:
                raise RuntimeError(f"lost rank 0 at {where}: {exc}") from exc
            op = msg.get("op")
            if op == "ping":
                send(self.sock, {"op": "pong"})
            elif op == "request":
                try:
                    handle(msg)
                    send(self.sock, {"ok": True, "part": part(msg["id"], self.rank)})
                except Exception as exc:
                    send(self.sock, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            elif op == "stop":
                on_stop(msg)
                with contextlib.suppress(OSError):
                    send(self.sock, {"op": "bye"})
                return
            else:
                send(self.sock, {"ok": False, "error": f"unknown op {op!r}"})
