"""Head -> workers copy: real rsync through a stand-in ssh that runs the remote side locally."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import pytest
from sparkfleet_lab.ports import free_port
from test_weights_support import load_module

dist = load_module("weights_distribute")
pytestmark = pytest.mark.skipif(
    shutil.which("rsync") is None, reason="rsync is not installed on this machine"
)

# ssh [options] host command...: drop the options and the host, run the command here
FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-i|-c|-p|-l) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
shift  # the host
exec sh -c "$*"
"""


@pytest.fixture
def setup(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ssh = bindir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    src = tmp_path / "head"
    (src / "engram").mkdir(parents=True)
    files = []
    for i, size in enumerate([300_000, 200_000, 50_000, 10]):
        rel = f"model-{i}.safetensors" if i < 3 else "engram/config.json"
        (src / rel).write_bytes(os.urandom(size))
        files.append({"path": rel, "size": size})
    workers = [tmp_path / "w1", tmp_path / "w2"]
    for w in workers:
        w.mkdir()
    return src, workers, files, tmp_path


def targets(workers, files, n_addr=2):
    return [
        {"host": w.name, "user": "", "addresses": [f"10.0.{i}.{k}" for k in range(n_addr)], "files": files}
        for i, w in enumerate(workers)
    ]


def run(src, dest, tgts, tmp, **extra):
    return dist.run(
        {
            "src": str(src),
            "dest": str(dest),
            "targets": tgts,
            "streams_per_address": 1,
            "status_file": str(tmp / "progress.json"),
            **extra,
        }
    )


def test_split_streams_balances_bytes():
    files = [{"path": str(i), "size": s} for i, s in enumerate([90, 50, 40, 30, 10])]
    streams = dist.split_streams(files, 2)
    loads = sorted(sum(f["size"] for f in s) for s in streams)
    assert sum(loads) == 220 and loads[1] - loads[0] <= 30  # within the smallest big file
    assert sorted(f["path"] for s in streams for f in s) == [str(i) for i in range(5)]
    assert len(dist.split_streams(files[:1], 4)) == 1  # no empty streams


def test_copies_to_every_worker_and_only_the_listed_files(setup):
    src, workers, files, tmp = setup
    (src / "stray.bin").write_bytes(b"not in the manifest")
    # each worker gets its own dest; the module uses one dest path for all, as on real nodes
    for w in workers:
        out = run(src, w, [targets([w], files)[0]], tmp)
        assert out["changed"] and sorted(out["copied"][w.name]) == sorted(f["path"] for f in files)
        for f in files:
            assert (w / f["path"]).read_bytes() == (src / f["path"]).read_bytes()
        assert not (w / "stray.bin").exists()
    progress = json.loads((tmp / "progress.json").read_text())
    assert progress["state"] == "done" and progress["done_bytes"] == sum(f["size"] for f in files)


def test_nothing_to_copy_is_no_change_and_check_mode_copies_nothing(setup):
    src, workers, files, tmp = setup
    w = workers[0]
    assert not run(src, w, [dict(targets([w], files)[0], files=[])], tmp)["changed"]
    out = dist.run({"src": str(src), "dest": str(w), "targets": targets([w], files)}, check_mode=True)
    assert out["changed"] and not any(w.iterdir())


def test_a_partial_file_resumes_from_rsyncs_partial_dir(setup):
    src, workers, files, tmp = setup
    w = workers[0]
    part = w / ".rsync-partial" / "model-0.safetensors"
    part.parent.mkdir()
    part.write_bytes((src / "model-0.safetensors").read_bytes()[:150_000])
    run(src, w, [dict(targets([w], files)[0], files=files[:1])], tmp)
    assert (w / "model-0.safetensors").read_bytes() == (src / "model-0.safetensors").read_bytes()
    assert not part.exists()


def test_a_failed_stream_is_reported_with_the_worker(setup):
    src, workers, files, tmp = setup
    w = workers[0]
    with pytest.raises(dist.WeightsError) as exc:
        run(src, w / "missing" / "deeper", [targets([w], files, n_addr=1)[0]], tmp, rsync="false")
    assert w.name in str(exc.value) and "rsync exit" in str(exc.value)


def test_a_worker_without_fabric_address_is_refused(setup):
    src, workers, files, tmp = setup
    with pytest.raises(dist.WeightsError, match="no fabric address"):
        run(src, workers[0], [dict(targets(workers[:1], files)[0], addresses=[])], tmp)


def test_the_rsync_daemon_transport_copies_to_every_worker(setup):
    import random

    src, workers, files, tmp = setup
    for w in workers:
        (w / "snapshot").mkdir()
    port = random.randint(20000, 40000)  # noqa: S311 - a free-ish test port, not a secret
    tgts = [{"host": w.name, "user": "", "addresses": ["127.0.0.1"], "files": files} for w in workers[:1]]
    out = run(src, workers[0] / "snapshot", tgts, tmp, transport="rsyncd", rsyncd_port=port)
    assert out["changed"] and sorted(out["copied"][workers[0].name]) == sorted(f["path"] for f in files)
    for f in files:
        assert (workers[0] / "snapshot" / f["path"]).read_bytes() == (src / f["path"]).read_bytes()
    # the daemon is gone once the copy is done, and a second copy has nothing to send
    import socket

    with socket.socket() as s, pytest.raises(OSError):
        s.connect(("127.0.0.1", port))


@pytest.fixture
def small_disk(tmp_path):
    """A worker directory on a 400 KB tmpfs (root and mount(2) needed, else skipped)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def test_a_full_disk_names_node_and_path_keeps_no_partial_file_and_a_rerun_completes(setup, small_disk):
    src, _, files, tmp = setup
    w = small_disk / "snapshot"
    w.mkdir()
    tgt = [{"host": "spark2", "user": "", "addresses": ["10.0.0.2"], "files": files}]  # 550 KB onto 400 KB
    with pytest.raises(dist.WeightsError) as exc:
        run(src, w, tgt, tmp)
    msg = exc.value.args[0]
    assert msg.startswith(f"spark2: the disk is full at {w} (No space left on device while writing model-")
    assert "free space there and run `sparkfleet weights` again" in msg
    assert exc.value.args[1]["disk_full"]["spark2"].startswith("model-")
    # nothing cut off sits at a final path: every file there is whole
    for f in files:
        final = w / f["path"]
        assert not final.exists() or final.read_bytes() == (src / f["path"]).read_bytes(), f["path"]
    assert not all((w / f["path"]).exists() for f in files)
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)  # space freed
    run(src, w, tgt, tmp)
    assert all((w / f["path"]).read_bytes() == (src / f["path"]).read_bytes() for f in files)
    assert not any((w / ".rsync-partial").glob("*"))


def test_disk_full_reads_rsyncs_words():
    err = (
        'rsync: [receiver] write failed on "/srv/m/snapshot/model-00003.safetensors": '
        "No space left on device (28)\n"
        "rsync error: error in file IO (code 11) at receiver.c(381) [receiver=3.2.7]\n"
    )
    assert dist.disk_full(err, "/srv/m/snapshot/") == "model-00003.safetensors"
    assert dist.disk_full("rsync error: some other thing (code 12)", "/srv/m/snapshot") is None


# ---- transport tcp: the receiver runs here through the stand-in ssh, bound to 127.0.0.1 -----------------
# (its port below the ephemeral range, as every lab listener's: lab/sparkfleet_lab/ports.py says why)
def tcp_targets(files, host="spark2"):
    return [{"host": host, "user": "", "addresses": ["127.0.0.1"], "files": files}]


def test_the_tcp_transport_copies_whole_files_with_the_heads_mtime_and_leaves_no_receiver(setup):
    import socket

    src, workers, files, tmp = setup
    w = workers[0]
    port = free_port()
    out = run(src, w, tcp_targets(files), tmp, transport="tcp", rsyncd_port=port, streams_per_address=2)
    assert out["changed"] and out["streams"] == 2
    assert sorted(out["copied"]["spark2"]) == sorted(f["path"] for f in files)
    for f in files:
        assert (w / f["path"]).read_bytes() == (src / f["path"]).read_bytes()
        assert (w / f["path"]).stat().st_mtime_ns == (src / f["path"]).stat().st_mtime_ns
    assert not list(w.rglob(".rsync-partial"))  # the parts' directories went with the receiver
    with socket.socket() as s, pytest.raises(OSError):
        s.connect(("127.0.0.1", port))
    # a second run finds every file there (size and mtime): nothing is sent again
    again = run(src, w, tcp_targets(files), tmp, transport="tcp", rsyncd_port=port)
    assert again["copied"]["spark2"] == []


def test_the_tcp_transport_resumes_a_part_and_sends_only_the_rest(setup, monkeypatch):
    src, workers, files, tmp = setup
    w = workers[0]
    whole = (src / "model-0.safetensors").read_bytes()
    part = w / ".rsync-partial" / "model-0.safetensors"
    part.parent.mkdir()
    part.write_bytes(whole[:120_000])
    sent = []
    real = dist.socket.socket.sendfile

    def counting(self, fh, offset=0, count=None):
        n = real(self, fh, offset, count)
        sent.append((offset, n))
        return n

    monkeypatch.setattr(dist.socket.socket, "sendfile", counting)
    run(src, w, tcp_targets(files[:1]), tmp, transport="tcp", rsyncd_port=free_port())
    assert (w / "model-0.safetensors").read_bytes() == whole
    assert sent[0][0] == 120_000 and sum(n for _, n in sent) == len(whole) - 120_000
    assert not part.exists()


def test_the_tcp_transport_on_a_full_disk_names_node_and_path_keeps_the_part_and_a_rerun_completes(
    setup, small_disk
):
    src, _, files, tmp = setup
    w = small_disk / "snapshot"
    w.mkdir()
    port = free_port()
    with pytest.raises(dist.WeightsError) as exc:  # 550 KB onto 400 KB
        run(src, w, tcp_targets(files), tmp, transport="tcp", rsyncd_port=port)
    msg = exc.value.args[0]
    assert msg.startswith(f"spark2: the disk is full at {w} (No space left on device while writing model-")
    for f in files:
        final = w / f["path"]
        assert not final.exists() or final.read_bytes() == (src / f["path"]).read_bytes(), f["path"]
    assert any((w / ".rsync-partial").iterdir())  # the cut-off file's part, for the next run
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)  # space freed
    run(src, w, tcp_targets(files), tmp, transport="tcp", rsyncd_port=port)
    assert all((w / f["path"]).read_bytes() == (src / f["path"]).read_bytes() for f in files)
    assert not (w / ".rsync-partial").exists()


def test_the_tcp_transport_names_a_worker_it_cannot_reach(setup, tmp_path):
    src, workers, files, tmp = setup
    down = tmp_path / "bin" / "ssh-down"
    down.write_text(
        "#!/bin/sh\necho 'ssh: connect to host 127.0.0.1 port 22: No route to host' >&2\nexit 255\n"
    )
    down.chmod(0o755)
    with pytest.raises(
        dist.WeightsError, match=r"^spark2: could not start a receiver on 127\.0\.0\.1: .*No route"
    ):
        run(src, workers[0], tcp_targets(files), tmp, transport="tcp", rsyncd_port=free_port(), ssh=str(down))
    assert not any(workers[0].iterdir())


def test_the_tcp_receiver_refuses_a_path_out_of_the_snapshot(setup):
    src, workers, _, tmp = setup
    (src / "sub").mkdir()
    (src / "x").write_bytes(b"x")  # the head has sub/../x
    with pytest.raises(dist.WeightsError, match=r"refused path '\.\./x'"):
        run(
            src / "sub",
            workers[0],
            tcp_targets([{"path": "../x", "size": 1}]),
            tmp,
            transport="tcp",
            rsyncd_port=free_port(),
        )
    assert not (workers[0].parent / "x").exists()
