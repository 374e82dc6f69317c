"""The engine double's ranks as processes on loopback: loading, the log lines, the rendezvous, the settings
agreement, the kernel cache, lost ranks and the stop order."""

from __future__ import annotations

import json
import time

import pytest
from test_engine_double_support import (
    HEALTH_KEYS,
    LINES,
    LocalCluster,
    call,
    chat,
    make_snapshot,
    until,
    wait_line,
)


def lines(rank, kind: str) -> list:
    return [m for ln in rank.output().splitlines() if (m := LINES[kind].match(ln))]


def test_port_closed_while_loading_then_the_real_bodies_and_lines(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    cluster = LocalCluster(2, [snap] * 2, tmp_path / "run", load_s=3, rank0=["--alias", "alias-1"])
    with cluster:
        cluster.start(ready_timeout=0)
        wait_line(cluster.ranks[0], r"startup estimate")
        status, doc = cluster.health()
        assert status == 0 and "refused" in doc["error"].lower()  # no "loading" answer: the port is closed
        assert not lines(cluster.ranks[0], "serving")
        body = cluster.wait_ready(60)
        assert list(body) == HEALTH_KEYS
        assert body["ok"] is True and body["backend"] == "tensorfold" and body["context_length"] == 1048576
        assert all(body[k] == 0 for k in HEALTH_KEYS[3:-1])
        status, models, _ = call(cluster.url, "/v1/models")
        assert status == 200 and models == {
            "object": "list",
            "data": [
                {"id": "standin-model", "object": "model", "owned_by": "tensorfold"},
                {"id": "alias-1", "object": "model", "owned_by": "tensorfold"},
            ],
        }
        head, worker = cluster.ranks[0], cluster.ranks[1]
        assert lines(head, "loading")[0].groups() == ("standin-model", "0", "2")
        assert lines(worker, "loading")[0].groups() == ("standin-model", "1", "2")
        assert lines(head, "estimate")[0].groups() == ("0", "1048576", "1048576", "1048582")
        assert lines(worker, "estimate")[0].group(1) == "1"
        assert [m.group(3) for m in lines(head, "weights")] == [" and DSpark"]
        serving = lines(head, "serving")[0]
        assert serving.group(1, 2, 3, 4, 5, 6) == (
            "standin-model",
            "127.0.0.1",
            str(cluster.port),
            "2",
            "on",
            "1048576",
        )
        assert lines(worker, "following")[0].group(1) == "1"
        assert not lines(worker, "serving") and not lines(head, "following")


def test_the_serving_line_says_the_sampling_and_drafts_it_was_given(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    extra = ["--no-drafts", "--context", "65538", "--top-p", "1.0"]
    with LocalCluster(2, [snap] * 2, tmp_path / "run", extra=extra).start() as cluster:
        line = wait_line(cluster.ranks[0], r"serving ")
        assert (
            "(sampling: top_p 1.0; drafts: off; prompts: bf16 activations; context: 65538; loaded in" in line
        )
        assert lines(cluster.ranks[0], "weights")[0].group(3) is None  # no DSpark without drafts
        assert cluster.health()[1]["context_length"] == 65538
    with LocalCluster(2, [snap] * 2, tmp_path / "run2", extra=["--temperature", "0"]).start() as cluster:
        assert "(sampling: greedy; drafts: on;" in wait_line(cluster.ranks[0], r"serving ")


def test_workers_wait_for_rank_0_and_rank_0_waits_for_them(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(3, [snap] * 3, tmp_path / "run", version="tp3-recipe") as cluster:
        cluster.start_rank(2)
        cluster.start_rank(1)
        time.sleep(1.5)  # the workers keep trying rank 0's store (no rank 0 yet)
        assert all(r.proc.poll() is None for r in cluster.ranks.values())
        assert cluster.health()[0] == 0
        cluster.start_rank(0)
        assert cluster.wait_ready(60)["ok"] is True


def test_a_worker_waits_at_the_rendezvous_for_a_late_rank_and_for_a_slower_rank_0(tmp_path):
    # A TCPStore client waits for the others until the rendezvous timeout (600 s): a worker that joined must
    # neither give up after its first read timeout (1 s at the rendezvous) nor while rank 0 still loads (0.5 s
    # reads), as the double did when it read through a socket file, which refuses every read after a timeout.
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(3, [snap] * 3, tmp_path / "run", version="tp3-recipe", load_s=0.2) as cluster:
        cluster.start_rank(0, env={"SPARKFLEET_LAB_ENGINE_LOAD_S": "2.5"})  # rank 0 loads longest
        cluster.start_rank(1)
        wait_line(cluster.ranks[1], r"loading ")
        time.sleep(3)  # rank 1 joined; rank 2 is not there yet
        assert cluster.ranks[1].proc.poll() is None, cluster.logs()
        cluster.start_rank(2)
        assert cluster.wait_ready(60)["ok"] is True, cluster.logs()
        assert all(r.proc.poll() is None for r in cluster.ranks.values()), cluster.logs()
        assert lines(cluster.ranks[1], "following") and lines(cluster.ranks[2], "following")


def test_the_rendezvous_gives_up_after_its_timeout(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    cluster = LocalCluster(2, [snap] * 2, tmp_path / "run", env={"SPARKFLEET_LAB_ENGINE_RENDEZVOUS_S": "1"})
    head = cluster.start_rank(0)
    assert head.proc.wait(timeout=30) == 1
    assert "Traceback" in head.output() and "1/2 ranks joined" in head.output()
    assert cluster.health()[0] == 0


@pytest.mark.parametrize(
    ("worker_extra", "named"),
    [
        (["--context", "65538"], "capacity rank 0 1048582, rank 1 65544"),
        (["--mtp-drafts", "5"], "drafts rank 0 3, rank 1 5"),
        (["--no-drafts"], "dspark_loaded rank 0 1, rank 1 0"),
        (["--mtp-confidence", "0.15"], "confidence_ppm rank 0 -1, rank 1 150000"),
        (["--parallel", "2"], "lanes rank 0 1, rank 1 2"),
    ],
)
def test_ranks_with_different_settings_refuse_to_serve(tmp_path, worker_extra, named):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run") as cluster:
        cluster.start_rank(1, extra=worker_extra)
        cluster.start_rank(0)
        for r in (0, 1):
            assert cluster.ranks[r].proc.wait(timeout=30) == 1
            out = cluster.ranks[r].output()
            assert (
                "Traceback" in out and "RuntimeError: the ranks were started with different settings" in out
            )
            assert named in out
        assert cluster.health()[0] == 0


def test_different_weights_files_are_refused_naming_both(tmp_path):
    good = make_snapshot(tmp_path / "good")
    other = make_snapshot(tmp_path / "other", tensor_bytes=8192)  # other sizes and headers
    with LocalCluster(2, [good, other], tmp_path / "run") as cluster:
        cluster.start(ready_timeout=0)
        for r in (0, 1):
            assert cluster.ranks[r].proc.wait(timeout=30) == 1
        out = cluster.ranks[1].output()
        assert "weights_layout rank 0 sha256:" in out and ", rank 1 sha256:" in out


def test_same_sizes_and_headers_are_the_same_layout(tmp_path):
    # the real family compares sizes and headers, not every byte: other tensor bytes still serve
    good = make_snapshot(tmp_path / "good")
    salted = make_snapshot(tmp_path / "salted", salt="x")
    with LocalCluster(2, [good, salted], tmp_path / "run").start() as cluster:
        assert cluster.health()[0] == 200


def test_a_bad_engine_variable_on_one_rank_stops_both(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run") as cluster:
        cluster.start_rank(1, env={"TF_DSV41_CACHE_ENTRIES": "8.5"})
        cluster.start_rank(0)
        for r in (0, 1):
            assert cluster.ranks[r].proc.wait(timeout=30) == 1
        bad, other = cluster.ranks[1].output(), cluster.ranks[0].output()
        assert "tensorfold: the TF_DSV41_* variables or the weights could not be read on this rank: " in bad
        assert "TF_DSV41_CACHE_ENTRIES=8.5: a whole number" in bad
        assert "could not be read on rank 1; see its log" in other


def test_different_cache_sizes_are_not_refused_the_smaller_wins(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run") as cluster:
        cluster.start_rank(1, env={"TF_DSV41_CACHE_GIB": "1", "TF_DSV41_CACHE_ENTRIES": "4"})
        cluster.start_rank(0)
        cluster.wait_ready(60)
        assert "kept in 1.0 GiB, 4 at most" in wait_line(cluster.ranks[0], r"other conversations")


def test_a_formed_cluster_takes_no_new_member(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run").start() as cluster:
        first = cluster.ranks[1]
        again = cluster.start_rank(1)
        assert again.proc.wait(timeout=30) == 1
        assert "cannot join a formed cluster; restart rank 0" in again.output()
        cluster.ranks[1] = first
        assert call(cluster.url, "/v1/chat/completions", chat("17*19"))[0] == 200


def test_a_lost_worker_fails_requests_and_rank_0_keeps_serving_errors(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run").start() as cluster:
        assert call(cluster.url, "/v1/chat/completions", chat("17*19"))[0] == 200
        cluster.kill(1)
        status, err, _ = until(
            lambda: (got := call(cluster.url, "/v1/chat/completions", chat("17*19")))[0] == 500 and got,
            "a failed request",
        )
        assert "rank 1 (127.0.0.1) was lost" in err["error"]["message"]
        assert cluster.ranks[0].proc.poll() is None
        out = cluster.ranks[0].output()
        assert (
            "[tensorfold] request error: RankLost: rank 1 (127.0.0.1) was lost" in out and "Traceback" in out
        )
        status, body = cluster.health()  # the real /health has no rank in it: ok stays true
        assert status == 200 and body["ok"] is True


def test_a_worker_that_loses_rank_0_exits_with_a_traceback(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run").start() as cluster:
        cluster.kill(0)
        assert cluster.ranks[1].proc.wait(timeout=30) == 1
        assert "RuntimeError: lost rank 0 at 127.0.0.1:" in cluster.ranks[1].output()


def test_rank_0_first_then_the_workers_follow_it_down(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    cluster = LocalCluster(3, [snap] * 3, tmp_path / "run", version="tp3-recipe").start()
    assert cluster.stop() == {0: 0, 1: 0, 2: 0}


def test_the_kernel_cache_is_built_once_then_found(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    cache = tmp_path / "tf" / "torch_extensions"
    env = {"TORCH_EXTENSIONS_DIR": str(cache)}
    with LocalCluster(2, [snap] * 2, tmp_path / "cold", env=env, jit_s=1).start():
        pass
    built = sorted(cache.glob("*/build.json"))
    assert [p.parent.name.rsplit("_", 1)[0] for p in built] == [
        "dsv41_engram_io",
        "dsv41_gemv",
        "dsv41_l2warm",
        "exl3_experts",
    ]
    stamps = {p: p.stat().st_mtime_ns for p in built}
    assert all(json.loads(p.read_text())["double"] for p in built)
    with LocalCluster(2, [snap] * 2, tmp_path / "warm", env=env, jit_s=1).start():
        pass
    assert {p: p.stat().st_mtime_ns for p in built} == stamps  # found, not built again


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("enp1s0f1np1", True),
        ("enp1s0", True),
        ("=enp1s0", False),
        ("=enP7s7,enp1s0f1np1", True),
        ("^lo", True),
        ("^enp,enP,lo", False),
        ("eth", False),
    ],
)
def test_nccl_socket_ifname_is_read_as_nccl_reads_it(tmp_path, value, ok):
    from sparkfleet_lab.engine.tensorfold import serve

    for name in ("lo", "enP7s7", "enp1s0f1np1"):
        (tmp_path / name).mkdir()
    env = {"NCCL_SOCKET_IFNAME": value}
    if ok:
        serve.nccl_interfaces(env, tmp_path)
    else:
        with pytest.raises(RuntimeError, match="NCCL error 5: invalid usage"):
            serve.nccl_interfaces(env, tmp_path)


def test_a_rank_whose_nccl_finds_no_interface_fails_and_rank_0_with_it(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run") as cluster:
        cluster.start_rank(1, env={"NCCL_SOCKET_IFNAME": "enp9s9f9np9"})
        cluster.start_rank(0)
        for r in (0, 1):
            assert cluster.ranks[r].proc.wait(timeout=30) == 1
        assert "NCCL WARN Bootstrap : no socket interface found" in cluster.ranks[1].output()
        assert "RuntimeError: NCCL error 5" in cluster.ranks[1].output()
        assert "rank 1 (127.0.0.1) failed while loading" in cluster.ranks[0].output()
