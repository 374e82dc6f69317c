"""Tensor-parallel rendezvous and the data plane between ranks: the stand-in's NCCL.

Rendezvous (management network, like torch's MASTER_ADDR/MASTER_PORT): rank 0 listens on
--master:--master-port; every worker connects (retrying until rank 0 is up: workers start
first) and sends its rank, the tensor-parallel size and its weights digest. Rank 0 accepts a rank
only if all three fit, and forms the cluster once every rank has joined.

Data plane (fabric): after it joined, a worker opens a TCP connection from its fabric address to
rank 0's fabric address on the cable between them (SPARKFLEET_FABRIC, set by sparkfleet's
engine_service from the addressing plan). Rank 0 checks the connection really comes from the
peer's fabric address. Rank 0 sends a heartbeat every second and one round trip per request
step ("all-reduce"); a worker that stops answering is marked lost, requests then fail with a clear
error, and /health says which rank is gone. A worker that loses rank 0 exits non-zero, as a
real rank does when its communicator breaks. A formed cluster does not take new members: a
restarted rank is refused until rank 0 restarts (a real NCCL communicator cannot be re-joined).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PROTOCOL = 1
MAX_LINE = 1 << 16
HEARTBEAT_S = 1.0
CALL_TIMEOUT_S = 5.0
WORKER_IDLE_S = 10.0  # a worker that hears nothing from rank 0 for this long considers it lost

Log = Callable[[str], None]


class ClusterError(RuntimeError):
    """Fatal for this rank (bad configuration, refused join, lost rank 0)."""


class RankUnavailable(RuntimeError):
    """A request cannot run because a rank is not there (rank 0 keeps serving errors)."""


@dataclass(frozen=True)
class Fabric:
    port: int
    peers: dict[int, tuple[str, str]]  # peer rank -> (this rank's fabric address, the peer's)

    @classmethod
    def parse(cls, value: str | None, rank: int, tp: int) -> Fabric:
        if not value:
            raise ClusterError(
                "SPARKFLEET_FABRIC is not set: the data plane needs each rank's fabric addresses "
                '(JSON {"port": P, "peers": {"<rank>": {"local": A, "peer": B}}})'
            )
        try:
            doc = json.loads(value)
            port = int(doc["port"])
            peers = {int(r): (str(p["local"]), str(p["peer"])) for r, p in doc["peers"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ClusterError(f"SPARKFLEET_FABRIC is not valid: {exc}") from exc
        want = set(range(1, tp)) if rank == 0 else {0}
        if set(peers) != want:
            raise ClusterError(
                f"SPARKFLEET_FABRIC names peers {sorted(peers)}; rank {rank} of {tp} needs {sorted(want)}"
            )
        if not 0 < port < 65536:
            raise ClusterError(f"SPARKFLEET_FABRIC port {port} is not a port")
        return cls(port=port, peers=peers)


def send(sock: socket.socket, obj: dict) -> None:
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


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


def reduce_part(payload: str, rank: int) -> int:
    """What each rank contributes to a request's all-reduce (rank 0 knows what to expect)."""
    return int.from_bytes(hashlib.sha256(f"{rank}|{payload}".encode()).digest()[:4], "big")


@dataclass
class Peer:
    rank: int
    address: str
    sock: socket.socket
    reader: object
    lock: threading.Lock = field(default_factory=threading.Lock)
    alive: bool = True
    error: str = ""
    rtt_ms: float = 0.0
    on_lost: Callable[[Peer], None] | None = None

    def call(self, msg: dict, timeout: float = CALL_TIMEOUT_S) -> dict:
        with self.lock:
            if not self.alive:
                raise RankUnavailable(self.error)
            start = time.monotonic()
            try:
                self.sock.settimeout(timeout)
                send(self.sock, msg)
                reply = recv(self.reader, f"rank {self.rank}")
            except (OSError, ValueError) as exc:
                reason = f"no answer within {timeout:.0f} s" if isinstance(exc, TimeoutError) else str(exc)
                self._lost(f"rank {self.rank} ({self.address}) lost: {reason}")
                raise RankUnavailable(self.error) from exc
            self.rtt_ms = (time.monotonic() - start) * 1000
            return reply

    def _lost(self, reason: str) -> None:
        if not self.alive:
            return
        self.alive, self.error = False, f"{reason} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.on_lost:
            self.on_lost(self)


class Coordinator:
    """Rank 0's side: rendezvous server, data-plane listeners, heartbeats, all-reduce."""

    def __init__(
        self, *, tp: int, master: str, master_port: int, fabric: Fabric, digest: str, log: Log
    ) -> None:
        self.tp, self.master, self.master_port = tp, master, master_port
        self.fabric, self.digest, self.log = fabric, digest, log
        self.cond = threading.Condition()
        self.sessions: dict[str, int] = {}  # session token -> rank (joined, data plane pending)
        self.joined: set[int] = set()
        self.peers: dict[int, Peer] = {}
        self.formed = False
        self.stopping = False
        self.last_refusal = ""
        self._sockets: list[socket.socket] = []
        self._seq = 0

    # ---- listeners ---------------------------------------------------------------------------
    def start(self) -> None:
        try:
            ctrl = socket.create_server((self.master, self.master_port), reuse_port=False)
        except OSError as exc:
            raise ClusterError(
                f"cannot listen for the rendezvous on {self.master}:{self.master_port}: {exc}"
            ) from exc
        self._sockets.append(ctrl)
        threading.Thread(
            target=self._accept, args=(ctrl, self._handle_join), name="rendezvous", daemon=True
        ).start()
        for local in sorted({loc for loc, _ in self.fabric.peers.values()}):
            try:
                data = socket.create_server((local, self.fabric.port), reuse_port=False)
            except OSError as exc:
                raise ClusterError(
                    f"cannot listen for the data plane on {local}:{self.fabric.port}: {exc}"
                ) from exc
            self._sockets.append(data)
            threading.Thread(
                target=self._accept, args=(data, self._handle_data), name=f"data-{local}", daemon=True
            ).start()
        self.log(
            f"rendezvous on {self.master}:{self.master_port}; data plane on "
            + ", ".join(
                f"{loc}:{self.fabric.port} (rank {r} from {peer})"
                for r, (loc, peer) in sorted(self.fabric.peers.items())
            )
        )

    def _accept(self, server: socket.socket, handler: Callable[[socket.socket, tuple], None]) -> None:
        while not self.stopping:
            try:
                conn, addr = server.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn, addr), daemon=True).start()

    def _refuse(self, conn: socket.socket, why: str) -> None:
        with self.cond:
            self.last_refusal = why
        self.log(f"refused: {why}")
        with contextlib.suppress(OSError):
            send(conn, {"ok": False, "error": why})
        conn.close()

    def _handle_join(self, conn: socket.socket, addr: tuple) -> None:
        try:
            conn.settimeout(10)
            msg = recv(conn.makefile("rb"), "join")
        except (OSError, ValueError) as exc:
            self.log(f"rendezvous from {addr[0]}: {exc}")
            conn.close()
            return
        rank, tp, digest = msg.get("rank"), msg.get("tp"), msg.get("digest")
        if msg.get("protocol") != PROTOCOL:
            return self._refuse(
                conn, f"rank {rank} from {addr[0]} speaks protocol {msg.get('protocol')}, rank 0 {PROTOCOL}"
            )
        if tp != self.tp:
            return self._refuse(
                conn, f"rank {rank} from {addr[0]} was started with --tp {tp}; rank 0 has --tp {self.tp}"
            )
        if not isinstance(rank, int) or not 0 < rank < self.tp:
            return self._refuse(
                conn, f"rank {rank!r} from {addr[0]} is not a worker rank of a TP{self.tp} cluster"
            )
        if digest != self.digest:
            return self._refuse(
                conn,
                f"rank {rank} from {addr[0]} has weights manifest digest {digest}, rank 0 has {self.digest}: "
                "the nodes do not have the same weights",
            )
        with self.cond:
            if self.formed:
                why = (
                    f"rank {rank} from {addr[0]} tried to join a formed cluster; restart rank 0 to re-form it"
                )
            elif rank in self.peers and self.peers[rank].alive:
                why = f"rank {rank} from {addr[0]} joined twice (two nodes with the same rank?)"
            else:
                why = ""
                # A rank that joined but never opened its data plane (it died) may join again.
                self.sessions = {s: r for s, r in self.sessions.items() if r != rank}
                session = secrets.token_hex(16)
                self.sessions[session] = rank
                self.joined.add(rank)
        if why:
            return self._refuse(conn, why)
        local, peer = self.fabric.peers[rank]
        self.log(f"rank {rank} joined from {addr[0]} (weights {digest[:19]}); data plane {peer} -> {local}")
        with contextlib.suppress(OSError):
            send(conn, {"ok": True, "session": session})
        conn.close()

    def _handle_data(self, conn: socket.socket, addr: tuple) -> None:
        reader = conn.makefile("rb")
        try:
            conn.settimeout(10)
            hello = recv(reader, "data plane hello")
        except (OSError, ValueError) as exc:
            self.log(f"data plane from {addr[0]}: {exc}")
            conn.close()
            return
        with self.cond:
            rank = self.sessions.pop(str(hello.get("session")), None)
        if rank is None:
            return self._refuse(conn, f"data plane connection from {addr[0]} without a rendezvous session")
        _local, peer = self.fabric.peers[rank]
        if addr[0] != peer:
            with self.cond:
                self.joined.discard(rank)
            return self._refuse(
                conn,
                f"rank {rank}'s data plane came from {addr[0]}, not its fabric address {peer} (routing?)",
            )
        node = Peer(rank=rank, address=peer, sock=conn, reader=reader, on_lost=self._on_lost)
        try:
            send(conn, {"ok": True})
        except OSError:
            return
        with self.cond:
            self.peers[rank] = node
            if len(self.peers) == self.tp - 1 and all(p.alive for p in self.peers.values()):
                self.formed = True
                self.log(f"all {self.tp} ranks joined; cluster formed")
            self.cond.notify_all()
        threading.Thread(target=self._heartbeat, args=(node,), name=f"heartbeat-{rank}", daemon=True).start()

    def _heartbeat(self, peer: Peer) -> None:
        while peer.alive and not self.stopping:
            try:
                reply = peer.call({"op": "ping"})
                if reply.get("op") != "pong":
                    peer._lost(f"rank {peer.rank} answered a heartbeat with {reply}")
            except RankUnavailable:
                return
            time.sleep(HEARTBEAT_S)

    def _on_lost(self, peer: Peer) -> None:
        if not self.stopping:
            self.log(peer.error)
        with self.cond:
            if not self.formed and self.peers.get(peer.rank) is peer:
                # Still forming: the rank may come back and join again.
                del self.peers[peer.rank]
                self.joined.discard(peer.rank)
            self.cond.notify_all()

    # ---- state -------------------------------------------------------------------------------
    def wait_formed(self, timeout: float | None = None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.formed or self.stopping, timeout)

    def health(self) -> tuple[str, str, list[dict]]:
        """(state, detail, ranks): state is starting, ok or degraded."""
        with self.cond:
            ranks = [{"rank": 0, "state": "ok", "address": self.master}]
            lost = []
            for r in range(1, self.tp):
                peer = self.peers.get(r)
                if peer is None:
                    ranks.append({"rank": r, "state": "joined" if r in self.joined else "waiting"})
                elif peer.alive:
                    ranks.append(
                        {"rank": r, "state": "ok", "address": peer.address, "rtt_ms": round(peer.rtt_ms, 3)}
                    )
                else:
                    ranks.append({"rank": r, "state": "lost", "address": peer.address, "error": peer.error})
                    lost.append(peer.error)
            if lost:
                return "degraded", "; ".join(lost), ranks
            if not self.formed:
                waiting = [r["rank"] for r in ranks if r["state"] != "ok"]
                detail = f"waiting for rank(s) {waiting} to join at {self.master}:{self.master_port}"
                if self.last_refusal:
                    detail += f"; last refused: {self.last_refusal}"
                return "starting", detail, ranks
            return "ok", f"all {self.tp} ranks joined", ranks

    def all_reduce(self, payload: str) -> int:
        """One round trip to every worker over the data plane; their parts combined."""
        state, detail, _ = self.health()
        if state != "ok":
            raise RankUnavailable(detail)
        with self.cond:
            self._seq += 1
            seq = self._seq
            peers = list(self.peers.values())
        total = reduce_part(payload, 0)
        for peer in peers:
            reply = peer.call({"op": "reduce", "id": seq, "payload": payload})
            if reply.get("id") != seq or reply.get("part") != reduce_part(payload, peer.rank):
                peer._lost(f"rank {peer.rank} returned a wrong all-reduce part")
                raise RankUnavailable(peer.error)
            total = (total + reply["part"]) % (1 << 32)
        return total

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            peers = list(self.peers.values())
        for peer in peers:
            if peer.alive:
                with contextlib.suppress(RankUnavailable):
                    peer.call({"op": "shutdown"}, timeout=2)
                peer._lost("shut down")
        for sock in self._sockets:
            sock.close()


@dataclass(frozen=True)
class WorkerConfig:
    rank: int
    tp: int
    master: str
    master_port: int
    fabric: Fabric
    digest: str
    join_timeout: float = 1800


def _join(cfg: WorkerConfig, log: Log, stop: threading.Event) -> str | None:
    """Rendezvous with rank 0 (retrying until it listens); the session token, None if stopped."""
    deadline = time.monotonic() + cfg.join_timeout
    announced = 0.0
    where = f"{cfg.master}:{cfg.master_port}"
    while True:
        if stop.is_set():
            return None
        try:
            ctrl = socket.create_connection((cfg.master, cfg.master_port), timeout=3)
            break
        except OSError as exc:
            now = time.monotonic()
            if now > deadline:
                raise ClusterError(
                    f"rank 0 did not answer at {where} within {cfg.join_timeout:.0f} s ({exc})"
                ) from exc
            if now - announced > 30:
                log(f"waiting for rank 0 at {where} ({exc})")
                announced = now
            stop.wait(1.0)
    with ctrl:
        ctrl.settimeout(30)
        send(ctrl, {"protocol": PROTOCOL, "op": "join", "rank": cfg.rank, "tp": cfg.tp, "digest": cfg.digest})
        try:
            reply = recv(ctrl.makefile("rb"), "rendezvous")
        except (OSError, ValueError) as exc:
            raise ClusterError(f"rendezvous with rank 0 at {where} failed: {exc}") from exc
    if not reply.get("ok"):
        raise ClusterError(f"rank 0 refused this rank: {reply.get('error')}")
    return str(reply["session"])


def _open_data_plane(cfg: WorkerConfig, session: str) -> tuple[socket.socket, object]:
    local, peer = cfg.fabric.peers[0]
    where = f"{local} -> {peer}:{cfg.fabric.port}"
    for attempt in range(10):
        try:
            data = socket.create_connection((peer, cfg.fabric.port), timeout=5, source_address=(local, 0))
            break
        except OSError as exc:
            if attempt == 9:
                raise ClusterError(f"data plane {where} failed: {exc}") from exc
            time.sleep(0.5)
    send(data, {"op": "hello", "rank": cfg.rank, "session": session})
    reader = data.makefile("rb")  # the one reader of this socket: it may buffer rank 0's first heartbeat
    try:
        data.settimeout(10)
        ack = recv(reader, "data plane")
    except (OSError, ValueError) as exc:
        data.close()
        raise ClusterError(f"data plane {where}: {exc}") from exc
    if not ack.get("ok"):
        data.close()
        raise ClusterError(f"rank 0 refused the data plane: {ack.get('error')}")
    return data, reader


def run_worker(cfg: WorkerConfig, log: Log, stop: threading.Event) -> int:
    """A worker rank: join rank 0, hold the data plane, answer until rank 0 says stop."""
    session = _join(cfg, log, stop)
    if session is None:
        return 0
    local, peer = cfg.fabric.peers[0]
    data, reader = _open_data_plane(cfg, session)
    with data:
        log(
            f"joined the cluster: rank {cfg.rank} of {cfg.tp}, data plane {local} -> {peer}:{cfg.fabric.port}"
        )
        data.settimeout(WORKER_IDLE_S)
        while not stop.is_set():
            try:
                msg = recv(reader, "rank 0")
            except TimeoutError as exc:
                raise ClusterError(
                    f"lost rank 0: no heartbeat over {local} -> {peer} for {WORKER_IDLE_S:.0f} s"
                ) from exc
            except (OSError, ValueError) as exc:
                raise ClusterError(f"lost rank 0 over {local} -> {peer}: {exc}") from exc
            op = msg.get("op")
            if op == "ping":
                send(data, {"op": "pong"})
            elif op == "reduce":
                send(data, {"id": msg.get("id"), "part": reduce_part(str(msg.get("payload")), cfg.rank)})
            elif op == "shutdown":
                send(data, {"op": "bye"})
                log("rank 0 shut the cluster down")
                return 0
            else:
                send(data, {"error": f"unknown op {op!r}"})
    return 0
