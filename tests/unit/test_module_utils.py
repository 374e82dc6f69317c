"""The collection's shared module code (plugins/module_utils): one atomic writer, one clock-state reader,
one node probe, the disk arithmetic, the API key file format, the weights modules' main. And the rule
that lets Ansible ship them: modules and module_utils import only the standard library, Ansible's
AnsibleModule and the collection's own module_utils."""

from __future__ import annotations

import ast
import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import module_runner
import pytest
from ansible_collections.sparkfleet.cluster.plugins.module_utils import (
    api_keys,
    clock_state,
    disk,
    fileio,
    node,
    weights_main,
)

ROOT = Path(__file__).resolve().parents[2]
MODULES = ROOT / "plugins/modules"
UTILS = ROOT / "plugins/module_utils"
OWN = "ansible_collections.sparkfleet.cluster.plugins.module_utils"


# ---- fileio ------------------------------------------------------------------------------------------
def test_write_atomic_writes_mode_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "a/b/state.conf"
    fileio.write_atomic(str(target), "one\n", 0o640)
    assert target.read_text() == "one\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o755
    fileio.write_atomic(str(target), b"two\n", fsync=False)
    assert target.read_bytes() == b"two\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.conf"]


def test_write_atomic_secret_is_private_before_it_is_written(tmp_path, monkeypatch):
    seen = {}
    real_replace = os.replace

    def replace(src, dst):
        seen["mode"] = stat.S_IMODE(os.stat(src).st_mode)
        seen["name"] = os.path.basename(src)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    fileio.write_atomic(str(tmp_path / "key"), "sk-secret\n", 0o600, uid=os.getuid(), gid=os.getgid())
    assert seen["mode"] == 0o600
    assert seen["name"].startswith(".")  # listings that skip dot-files never see a part


def test_write_atomic_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch):
    target = tmp_path / "state.conf"
    target.write_text("old\n")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space"):
        fileio.write_atomic(str(target), "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["state.conf"]


def test_read_text(tmp_path):
    (tmp_path / "f").write_text("x\n")
    assert fileio.read_text(str(tmp_path / "f")) == "x\n"
    assert fileio.read_text(str(tmp_path / "missing")) is None
    assert fileio.read_text(str(tmp_path)) is None  # a directory
    assert fileio.read_text(None) is None


# ---- clock_state -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "key", "cap"),
    [
        (clock_state.state_text(2300), clock_state.GPU_KEY, 2300),
        (clock_state.state_text(0), clock_state.GPU_KEY, 0),
        (clock_state.state_text(3600, clock_state.CPU_KEY), clock_state.CPU_KEY, 3600),
        ("2300\n", clock_state.GPU_KEY, 2300),  # the applied marker
        ("GPU_CLOCK_CAP_MHZ=2100\nGPU_CLOCK_CAP_MHZ=2300\n", clock_state.GPU_KEY, 2300),  # sourced: last wins
        ('GPU_CLOCK_CAP_MHZ="2300"\n', clock_state.GPU_KEY, 2300),
        ("# GPU_CLOCK_CAP_MHZ=2300\n", clock_state.GPU_KEY, None),  # a comment
        ("CPU_CLOCK_CAP_MHZ=3600\n", clock_state.GPU_KEY, None),  # another key is not this cap
        ("GPU_CLOCK_CAP_MHZ=-5\n", clock_state.GPU_KEY, None),
        ("GPU_CLOCK_CAP_MHZ=2300 # x\n", clock_state.GPU_KEY, None),
        ("12\n34\n", clock_state.GPU_KEY, None),
        ("", clock_state.GPU_KEY, None),
        (None, clock_state.GPU_KEY, None),
    ],
)
def test_parse_cap(text, key, cap):
    assert clock_state.parse_cap(text, key) == cap


def test_state_file_is_what_the_boot_script_sources(tmp_path):
    """sparkfleet-clocks.service sources gpu.conf with sh: the file must set the variable the script reads."""
    conf = tmp_path / "gpu.conf"
    conf.write_text(clock_state.state_text(2300))
    out = subprocess.run(
        ["sh", "-c", f'. "{conf}"; printf %s "$GPU_CLOCK_CAP_MHZ"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "2300"


def test_read_caps_below_a_root(tmp_path):
    state = tmp_path / "var/lib/sf/clocks"
    state.mkdir(parents=True)
    (state / "gpu.conf").write_text(clock_state.state_text(2300))
    (state / "cpu.conf").write_text(clock_state.state_text(3600, clock_state.CPU_KEY))
    caps = clock_state.read_caps("/var/lib/sf", "/run/sf", root=str(tmp_path))
    assert caps == {"gpu_configured": 2300, "gpu_applied": None, "cpu_configured": 3600}
    assert clock_state.read_cap(str(tmp_path / "nothing")) is None


def test_state_diff():
    diff = clock_state.state_diff("/x/gpu.conf", None, 2300)
    assert diff["before"] == "" and diff["after"].endswith("GPU_CLOCK_CAP_MHZ=2300\n")
    diff = clock_state.state_diff("/x/cpu.conf", 3600, 0, clock_state.CPU_KEY)
    assert diff["before"].endswith("CPU_CLOCK_CAP_MHZ=3600\n") and diff["after"].endswith("=0\n")


def run_module(path: Path, real: bool, **args: object) -> dict:
    """The module's result (tests/unit/module_runner.py: its main() here, or its own process when real)."""
    return module_runner.run(path.stem, args, real=real)


@pytest.mark.parametrize("cap", [2300, 0])
def test_every_reader_of_the_clock_state_reads_what_gpu_clocks_writes(tmp_path, cap):
    """The state file gpu_clocks writes, read by preflight_facts, host_status and engine_node: one cap. For
    the first cap each module is its own process, as Ansible runs it."""
    real = cap == 2300
    root = tmp_path / "root"
    (root / "var/lib/sparkfleet/clocks").mkdir(parents=True)
    (root / "run/sparkfleet/clocks").mkdir(parents=True)
    conf = root / "var/lib/sparkfleet/clocks/gpu.conf"
    applied = root / "run/sparkfleet/clocks/gpu.applied"
    fileio.write_atomic(str(conf), clock_state.state_text(cap))
    fileio.write_atomic(str(applied), f"{cap}\n")

    absent = {"docker": "no-docker-here", "nvidia_smi": "no-smi-here"}
    pre = run_module(MODULES / "preflight_facts.py", real, weights_path=str(tmp_path / "w"),
                     gpu_clock_state_file=str(conf), **absent)  # fmt: skip
    assert pre["settings"]["gpu_clock_cap"] == str(cap)
    status = run_module(MODULES / "host_status.py", real, expect={"gpu_cap_mhz": cap}, root=str(root),
                        nvidia_smi="no-smi-here")  # fmt: skip
    assert (status["facts"]["gpu_cap_configured"], status["facts"]["gpu_cap_applied"]) == (cap, cap)
    assert next(c for c in status["checks"] if c["check"] == "GPU clock cap")["status"] == "ok"
    eng = run_module(MODULES / "engine_node.py", real, name="x", docker="no-docker-here",
                     clock_state_file=str(conf), clock_applied_file=str(applied))  # fmt: skip
    assert eng["clock"] == {"configured_mhz": cap, "applied_mhz": cap}


# ---- preflight_facts' interfaces: what Ansible's network facts list (the gathering left that subset out) --
def _preflight_facts_module():
    spec = importlib.util.spec_from_file_location("preflight_facts_mod", MODULES / "preflight_facts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.xdist_group("host-interfaces")  # not beside the unit tests that add a veth pair
def test_preflight_interfaces_are_ansibles_interfaces_on_this_machine():
    """The same names as ansible_interfaces from Ansible's own Linux network collector, run here."""
    import shutil

    from ansible.module_utils.facts.network.linux import LinuxNetwork

    class Module:  # what the collector asks of an AnsibleModule
        def get_bin_path(self, name, required=False, opt_dirs=None):
            return shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")

        def run_command(self, args, **_kw):
            done = subprocess.run(args, capture_output=True, text=True, check=False)
            return done.returncode, done.stdout, done.stderr

    def ansibles():
        return sorted(LinuxNetwork(Module()).populate()["interfaces"])

    # CI runs this beside the lab lanes, which add and remove docker interfaces at any moment (and in one
    # CI run a veth pair of test_network_cabling, on the other xdist worker, came up between two reads). So
    # compare ours with Ansible's reads before and after it, where those two agree: the machine held still.
    ours_mod = _preflight_facts_module()
    for _ in range(20):
        before, ours, after = ansibles(), ours_mod.interfaces(), ansibles()
        if before == after:
            break
    else:
        pytest.fail(f"the interfaces changed under every one of 20 comparisons; last: {before} / {after}")
    assert before and ours == before


def test_preflight_facts_returns_the_facts_setup_gathers(tmp_path):
    """preflight_facts replaced the setup task before it: the same facts, for the same subset."""
    mod = _preflight_facts_module()
    setup = module_runner.in_process("setup", {"gather_subset": mod.FACT_SUBSET}, package="ansible.modules")
    absent = {"docker": "no-docker-here", "nvidia_smi": "no-smi-here"}
    ours = run_module(MODULES / "preflight_facts.py", False, weights_path=str(tmp_path / "w"), **absent)
    assert {"ansible_distribution", "ansible_architecture", "ansible_kernel"} <= set(ours["ansible_facts"])
    assert ours["ansible_facts"] == setup["ansible_facts"]


def test_preflight_interfaces_count_directories_and_links_to_them_only(tmp_path):
    net = tmp_path / "class/net"
    (net / "eth0").mkdir(parents=True)
    (tmp_path / "devices/virtual/net/lo").mkdir(parents=True)
    (net / "lo").symlink_to(tmp_path / "devices/virtual/net/lo")
    (net / "gone").symlink_to(tmp_path / "devices/virtual/net/gone")  # a dangling link
    (net / "bonding_masters").write_text("\n")  # a file, as on a node with the bonding driver
    mod = _preflight_facts_module()
    assert mod.interfaces(str(net)) == ["eth0", "lo"]
    assert mod.interfaces(str(tmp_path / "missing")) == []


def test_engine_node_reports_the_paths_engine_service_writes_and_the_filter_judges_them(tmp_path):
    """engine_node's `paths` read, fed to the files_pending filter as engine_service does (configure.yml)."""
    from ansible_collections.sparkfleet.cluster.plugins.filter.engine import files_pending

    helper, cache = tmp_path / "helper", tmp_path / "cache"
    fileio.write_atomic(str(helper), "#!/bin/sh\n", 0o755, uid=0, gid=0)
    cache.mkdir(mode=0o755)
    cache.chmod(0o755)
    eng = run_module(MODULES / "engine_node.py", False, name="x", docker="no-docker-here",
                     paths=[str(helper), str(cache), str(tmp_path / "missing")])  # fmt: skip
    assert eng["paths"][str(tmp_path / "missing")] is None
    assert eng["paths"][str(cache)]["directory"] and eng["paths"][str(cache)]["mode"] == "0755"
    files = [{"path": str(helper), "content": "#!/bin/sh\n", "mode": "0755"}]
    dirs = [{"path": str(cache), "mode": "0755"}]
    unit = {"name": "x.service", "enabled": "enabled", "need_reload": False}
    clean = {**eng, "unit": unit}
    assert files_pending(clean, files=files, dirs=dirs, enable=["x.service"]) == []
    edited = [{**files[0], "content": "#!/bin/bash\n"}]
    assert files_pending(clean, files=edited, dirs=dirs) == [f"{helper}: content"]
    assert files_pending(clean, files=files, dirs=[{"path": str(tmp_path / "missing"), "mode": "0755"}]) == [
        f"{tmp_path / 'missing'}: missing"
    ]
    reload = {**clean, "unit": {**unit, "need_reload": True}}
    assert files_pending(reload, files=files) == ["x.service: systemd reload"]
    # a unit the read did not report is not known to be enabled: the files task decides
    assert files_pending(clean, files=files, enable=["x-watch.service"]) == ["x-watch.service: enable"]


# ---- disk ---------------------------------------------------------------------------------------------
def test_existing_parent_and_free_bytes(tmp_path):
    assert disk.existing_parent(str(tmp_path / "a/b/c")) == str(tmp_path)
    free, where = disk.free_bytes(str(tmp_path / "a/b"))
    st = os.statvfs(tmp_path)
    assert where == str(tmp_path)
    assert abs(free - st.f_bavail * st.f_frsize) < 64 << 20  # the same filesystem, moments apart


def test_tree_bytes_counts_hard_links_once(tmp_path):
    (tmp_path / "hub").mkdir()
    blob = tmp_path / "hub/blob"
    blob.write_bytes(b"x" * 100_000)
    os.link(blob, tmp_path / "snapshot")
    assert disk.tree_bytes(str(tmp_path)) == blob.stat().st_blocks * 512
    assert disk.tree_bytes(str(tmp_path / "missing")) == 0
    assert disk.tree_bytes(str(blob)) == 0  # not a directory


# ---- node probe ---------------------------------------------------------------------------------------
@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "node"

    def put(path: str, text: str | bytes) -> None:
        f = root / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            f.write_bytes(text)
        else:
            f.write_text(text)

    put("/etc/os-release", 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nID=ubuntu\nVERSION_ID="24.04"\n')
    put("/proc/cmdline", "BOOT_IMAGE=/vmlinuz ro quiet kho=off\n")
    put("/sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]\n")
    put("/proc/sys/vm/min_free_kbytes", "1048576\n")
    put("/proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456\n")
    put("/proc/meminfo", "MemTotal:       128000000 kB\nMemFree:  1000 kB\nMemAvailable:   100000000 kB\n")
    put("/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/swap.sf file 16777152 0 -2\n")
    put("/swap.sf", bytes(65536 - 10) + b"SWAPSPACE2" + bytes(1 << 20))
    put("/sys/class/infiniband/rocep1s0f1/fw_ver", "28.45.1020\n")
    put("/sys/module/nvidia/version", "580.95.05\n")
    put("/sys/module/nvidia_uvm/parameters/uvm_pack_sysmem_leaf_tables", "Y\n")
    put("/run/reboot-required.pkgs", "linux-image-x\n")
    put("/run/reboot-required", "*** System restart required ***\n")
    put("/var/lib/sparkfleet/clocks/gpu.conf", clock_state.state_text(2300))
    put(
        "/proc/net/tcp",
        "  sl  local_address rem_address   st\n   0: 0100007F:22B8 00000000:0000 0A 00000000:00000000\n",
    )
    return root


class FakeModule:
    """get_bin_path and run_command as AnsibleModule has them, answering from a table."""

    def __init__(self, answers: dict[str, tuple[int, str, str]], missing: tuple[str, ...] = ()):
        self.answers, self.missing, self.ran = answers, missing, []

    def get_bin_path(self, name: str) -> str | None:
        return None if name in self.missing else f"/usr/bin/{name}"

    def run_command(self, argv: list[str]) -> tuple[int, str, str]:
        self.ran.append(argv)
        key = " ".join(argv[1:])
        return next((v for k, v in self.answers.items() if key.startswith(k)), (1, "", "no answer"))


def test_node_probe_reads_the_tree(tree):
    probe = node.NodeProbe(str(tree), kernel_release="6.11.0-1016-nvidia-64k", page_size=65536)
    assert probe.os_release() == {"id": "ubuntu", "version": "24.04", "name": "Ubuntu 24.04.3 LTS"}
    assert probe.kernel_release() == "6.11.0-1016-nvidia-64k" and probe.page_size() == 65536
    assert "kho=off" in probe.cmdline()
    assert probe.thp() == "never"
    assert probe.sysctl("vm.min_free_kbytes") == "1048576"
    assert probe.sysctl("net.ipv4.tcp_rmem") == "4096 131072 6291456"
    assert probe.sysctl("vm.no_such_key") is None
    assert probe.meminfo() == {"total_bytes": 128000000 * 1024, "available_bytes": 100000000 * 1024}
    swap = probe.swap("/swap.sf")
    assert swap["active_mib"] == 16383 and swap["swapfile_signature"] and swap["swapfile_active"]
    assert not node.NodeProbe(str(tree), page_size=4096).swap("/swap.sf")["swapfile_signature"]
    assert probe.cx7_firmware() == {"rocep1s0f1": "28.45.1020"}
    assert probe.memory_saver() is True and probe.nvidia_uvm_loaded()
    assert probe.reboot_required() == {"required": True, "packages": ["linux-image-x"]}
    assert probe.listening([8888, 22]) == [8888]
    assert probe.clock_caps() == {"gpu_configured": 2300, "gpu_applied": None, "cpu_configured": None}
    assert probe.driver_version(FakeModule({})) == "580.95.05"


def test_node_probe_of_an_empty_tree(tmp_path):
    probe = node.NodeProbe(str(tmp_path))
    assert probe.os_release()["id"] == "?"
    assert probe.thp() is None and probe.memory_saver() is None and not probe.nvidia_uvm_loaded()
    assert probe.meminfo() == {"total_bytes": 0, "available_bytes": 0}
    assert probe.swap("/swap.sf")["swapfile_signature"] is False
    assert probe.reboot_required() == {"required": False, "packages": []}
    assert probe.kernel_release() == os.uname().release
    assert probe.driver_version(FakeModule({}, missing=("nvidia-smi",))) is None
    smi = FakeModule({"--query-gpu=driver_version": (0, "580.95.05\n", "")})
    assert probe.driver_version(smi) == "580.95.05"


def test_node_probe_gpus_and_docker():
    probe = node.NodeProbe("/")
    smi = FakeModule(
        {
            "-L": (0, "GPU 0: NVIDIA GB10 (UUID: GPU-1)\n", ""),
            "--query-compute-apps": (0, "4242, python3\n", ""),
        }
    )
    assert probe.gpus(smi) == {
        "ok": True,
        "gpus": ["GPU 0: NVIDIA GB10 (UUID: GPU-1)"],
        "error": "",
        "compute_processes": ["4242, python3"],
    }
    broken = probe.gpus(FakeModule({"-L": (9, "", "NVIDIA-SMI has failed")}))
    assert not broken["ok"] and "failed" in broken["error"]
    assert probe.gpus(FakeModule({}, missing=("nvidia-smi",)))["error"] == "nvidia-smi not found in PATH"
    docker = FakeModule({"version": (0, "28.1.1\n", ""), "inspect": (0, "true\n", "")})
    assert probe.docker(docker, engine_container="sparkfleet-engine") == {
        "ok": True,
        "version": "28.1.1",
        "error": "",
        "engine_running": True,
    }
    down = probe.docker(FakeModule({"version": (1, "", "Cannot connect to the Docker daemon")}))
    assert not down["ok"] and "Cannot connect" in down["error"]


def test_parsers():
    assert node.thp_mode("[always] madvise never") == "always"
    assert node.thp_mode("garbage") is None
    assert node.parse_meminfo("MemTotal: 10 kB\nMemFree: 4 kB\n")["available_bytes"] == 4096
    tcp6 = (
        "  sl  local_address                         remote_address                        st\n"
        "   0: 00000000000000000000000000000000:7332 00000000000000000000000000000000:0000 0A\n"
        "   1: 00000000000000000000000000000000:22B8 00000000000000000000000000000000:0000 01\n"
    )
    assert node.listening_ports([tcp6], [8888, 29490]) == [29490]


# ---- api_keys -----------------------------------------------------------------------------------------
def test_key_file_format():
    text = "# keys\n\nsk-aaaaaaaaaaaaaaaa\nops: sk-bbbbbbbbbbbbbbbb\n  sk-cccccccccccccccc  \n"
    assert api_keys.parse_key_file(text) == [
        ("file-1", "sk-aaaaaaaaaaaaaaaa"),
        ("ops", "sk-bbbbbbbbbbbbbbbb"),
        ("file-3", "sk-cccccccccccccccc"),
    ]
    assert api_keys.parse_key_file("# only a comment\n") == []
    with pytest.raises(api_keys.KeyFileError, match="line 1: a label"):
        api_keys.parse_key_file("bad label: sk-x\n")
    with pytest.raises(api_keys.KeyFileError, match="line 2: a key"):
        api_keys.parse_key_file("sk-x\nops: sk y\n")
    with pytest.raises(api_keys.KeyFileError, match="a key"):
        api_keys.parse_key_file("ops:\n")


# ---- weights_main.run_module --------------------------------------------------------------------------
class Done(Exception):
    pass


class RecordingModule:
    def __init__(self):
        self.params = {"x": 1}
        self.check_mode = False

    def exit_json(self, **kw):
        raise Done(("exit", kw))

    def fail_json(self, **kw):
        raise Done(("fail", kw))


def outcome(run, **kw):
    with pytest.raises(Done) as info:
        weights_main.run_module(RecordingModule(), run, **kw)
    return info.value.args[0]


def test_run_module():
    assert outcome(lambda p, c: {"changed": False, "got": p["x"]}) == ("exit", {"changed": False, "got": 1})

    def refuse(p, c):
        raise weights_main.WeightsError("not enough disk", {"needed_bytes": 5, "msg": "dropped"})

    assert outcome(refuse) == ("fail", {"msg": "not enough disk", "needed_bytes": 5})

    class PatchError(Exception):
        pass

    def patch(p, c):
        raise PatchError("hunk 1 does not match")

    assert outcome(patch, known=(PatchError,)) == ("fail", {"msg": "hunk 1 does not match"})

    def bug(p, c):
        return {}["missing"]

    kind, result = outcome(bug)
    assert kind == "fail" and result["msg"] == "KeyError: 'missing'" and "Traceback" in result["exception"]


# ---- what Ansible can ship ----------------------------------------------------------------------------
def imports(path: Path) -> list[str]:
    """Every module a file imports (absolute imports, at any depth; __future__ left out)."""
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module != "__future__":
            out.append(n.module)
    return out


STDLIB = set(sys.stdlib_module_names)
# weights_fetch runs under the role's venv and imports huggingface_hub inside a function
LAZY = {("weights_fetch", "huggingface_hub")}


@pytest.mark.parametrize("path", sorted(MODULES.glob("*.py")), ids=lambda p: p.stem)
def test_module_imports_what_ansible_ships(path):
    for name in imports(path):
        root = name.split(".")[0]
        if (path.stem, root) in LAZY:
            continue
        assert (
            root in STDLIB
            or name == "ansible.module_utils.basic"
            # preflight_facts gathers setup's facts with Ansible's own collector: AnsiballZ ships that
            # package with the module as it does with ansible.builtin.setup
            or (path.stem == "preflight_facts" and name.startswith("ansible.module_utils.facts"))
            or name.startswith(OWN + ".")
            or name == OWN
        ), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", sorted(UTILS.glob("*.py")), ids=lambda p: p.stem)
def test_module_utils_are_stdlib_only(path):
    for name in imports(path):
        assert name.split(".")[0] in STDLIB or name.startswith(OWN), f"{path.name} imports {name}"


# ---- mitogen loads them before an async task detaches (plugins/strategy/sparkfleet.py) -----------------
def load_strategy():
    spec = importlib.util.spec_from_file_location(
        "sparkfleet_strategy", ROOT / "plugins/strategy/sparkfleet.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_strategy_finds_the_collection_module_utils_a_module_needs():
    from ansible_mitogen import module_finder

    strategy = load_strategy()

    def names(module: str) -> list[str]:
        found = strategy.collection_module_utils(str(MODULES / f"{module}.py"), module_finder.walk_imports)
        assert all(Path(path).is_file() and not pkg for _name, path, pkg in found)
        return [name.rsplit(".", 1)[1] for name, _path, _pkg in found]

    # fileio only through weights_hash and weights_progress
    assert names("weights_fetch") == [
        "fileio", "text_format", "weights_hash", "weights_layout", "weights_main", "weights_progress",
    ]  # fmt: skip
    assert names("host_status") == ["boot", "clock_state", "cluster_constants", "fileio", "node"]
    assert names("sysctl") == []


def test_strategy_puts_them_on_the_list_mitogen_imports_before_a_task():
    from ansible_mitogen import module_finder

    strategy = load_strategy()

    class FakeFinder:
        @staticmethod
        def scan(module_name, module_path, search_path):
            return [("ansible.module_utils.basic", "/ansible/module_utils/basic.py", False)]

        walk_imports = staticmethod(module_finder.walk_imports)

    class FakeService:
        def _get_builtin_names(self, builtin_path, resolved):
            return [name for name, path, _pkg in resolved if path.startswith(builtin_path)]

        def _get_custom_tups(self, builtin_path, resolved):
            return [entry for entry in resolved if not entry[1].startswith(builtin_path)]

    def patch():
        strategy.patch_mitogen_scan(
            FakeFinder, FakeService, strategy.collection_module_utils, strategy._is_collection_util
        )

    patch()
    resolved = FakeFinder.scan("m", str(MODULES / "weights_rank.py"), ())
    builtin = FakeService()._get_builtin_names("/ansible/module_utils", resolved)
    assert builtin == [
        "ansible.module_utils.basic",
        f"{OWN}.disk",
        f"{OWN}.fileio",
        f"{OWN}.text_format",
        f"{OWN}.weights_hash",
        f"{OWN}.weights_main",
        f"{OWN}.weights_progress",
        f"{OWN}.weights_rank_files",
        f"{OWN}.weights_safetensors",
    ]
    assert FakeService()._get_custom_tups("/ansible/module_utils", resolved) == []  # no fork, nothing pushed
    patch()  # patching twice changes nothing
    assert FakeFinder.scan("m", str(MODULES / "weights_rank.py"), ()) == resolved
