"""What a run costs on the controller, each a ratio of two measurements taken side by side in one run.

1. Reading a host's cached facts, as the VariableManager does once per task and node: ansible-core's
   jsonfile cache (wrapped in its interposer, which decodes the stored JSON on every read) vs
   sparkfleet.cluster.facts (plugins/cache/facts.py), over the same facts (this machine's own, gathered
   with ansible.cfg's gather_subset, copied to three host names). No lab needed.
2. With a converged lab named by SPARKFLEET_LAB (TP2 or TP3): plain ansible-playbook, no-op runs of
   playbooks/status.yml and site.yml with each fact cache (each filled first by an untimed site.yml run),
   then with the facts cache and each strategy (Ansible's linear, and
   sparkfleet's mitogen strategy), then linear without the callback sparkfleet.cluster.preload, then without
   sparkfleet.cluster.payloads (each run builds its module payloads again), then with Ansible's default
   inject_facts_as_vars (every host's facts copied to top-level variables at every task), then site.yml
   without the callback sparkfleet.cluster.changes (every phase gate reads its record itself); and
   `sparkfleet status` against plain ansible-playbook with the same settings (what the wrapper adds).
   Without a lab, 2 is reported as not run.
SPARKFLEET_BENCH_REPEAT (default 1) repeats each lab measurement and keeps the fastest.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import lab_from_env

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


# ansible.cfg's callbacks_enabled: a row that measures one of them runs without it and the rest as configured
def _callbacks() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    return [c.strip() for c in cfg["defaults"]["callbacks_enabled"].split(",")]


CALLBACKS = _callbacks()


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", **extra}


def _preflight_facts(plugin: str, where: Path, tmp: Path) -> None:
    """The facts a real run caches: playbooks/preflight.yml over the sample TP3 inventory of the unit tests
    (loopback hosts, a closed SSH port), with `plugin` as the fact cache. Layer 1 records every role's
    verdict as facts of each node (values Ansible tags with their origin and trust, as in every run);
    layer 2 then finds the nodes unreachable, which is expected here."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import test_preflight_bad_inventories as table

    inventory = table.write_inventory(tmp / plugin / "inventory", table.good("tp3"))
    subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks/preflight.yml")],
        env=_env(ANSIBLE_LOCAL_TEMP=str(tmp / "tmp"), ANSIBLE_CACHE_PLUGIN=plugin,
                 ANSIBLE_CACHE_PLUGIN_CONNECTION=str(where)),
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    if not any(where.glob("*spark1")):
        raise RuntimeError(f"{plugin}: preflight cached no facts in {where}")


READER = r"""
import sys, time
from ansible.plugins.loader import init_plugin_loader, cache_loader
init_plugin_loader([sys.argv[2]])
cache = cache_loader.get(sys.argv[1])
reads = int(sys.argv[3])
start = time.perf_counter()
for _ in range(reads):
    for host in ("spark1", "spark2", "spark3"):
        assert "sparkfleet_validation_values" in cache.get(host)
print(time.perf_counter() - start)
"""


def bench_fact_reads(tmp: Path) -> list[dict]:
    reads = 100  # a 100-task playbook on 3 nodes: the VariableManager reads facts once per task and node
    took = {}
    size = 0
    for plugin in ("ansible.builtin.jsonfile", "sparkfleet.cluster.facts"):
        where = tmp / plugin / "facts"
        _preflight_facts(plugin, where, tmp)
        size = max(size, *(f.stat().st_size for f in where.iterdir()))
        out = subprocess.run(
            [sys.executable, "-c", READER, plugin, str(ROOT / ".collections"), str(reads)],
            env=_env(ANSIBLE_CACHE_PLUGIN_CONNECTION=str(where)), capture_output=True, text=True, check=True,
            cwd=ROOT,
        )  # fmt: skip
        took[plugin] = float(out.stdout.strip())
    return [
        {
            "name": f"fact cache: {reads} reads of 3 nodes' facts",
            "baseline": took["ansible.builtin.jsonfile"],
            "candidate": took["sparkfleet.cluster.facts"],
            "unit": "s",
            "ratio": took["ansible.builtin.jsonfile"] / took["sparkfleet.cluster.facts"],
            "how": f"the facts preflight caches for a TP3 inventory (largest file {size >> 10} KiB): "
            "ansible.builtin.jsonfile (interposer) vs sparkfleet.cluster.facts",
        }
    ]


def _timed(argv: list[str], env: dict[str, str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
            )
        best = min(best, took)
    return best


def _peak(argv: list[str], env: dict[str, str]) -> float:
    """The largest resident set, in MB, of the run's process and the children it waited for (wait4)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            out.seek(0)
            raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}\n{out.read()[-3000:].decode()}")
    return usage.ru_maxrss / 1024  # KiB on Linux


# The roles' YAML files parsed by the validate and phase_state actions with PyYAML's pure-Python parser, as
# before plugin_utils/yaml_files.py: a sitecustomize on PYTHONPATH hands yaml.load SafeLoader where that
# module asks for CSafeLoader (only there: ansible-core parses the playbook with libyaml either way).
PURE_YAML = r"""
import sys, yaml
_load = yaml.load
def load(stream, Loader):
    caller = sys._getframe(1).f_globals.get("__name__", "")
    if Loader is getattr(yaml, "CSafeLoader", None) and caller.endswith(".plugin_utils.yaml_files"):
        Loader = yaml.SafeLoader
    return _load(stream, Loader)
yaml.load = load
"""


# What each task's worker process spent (TaskExecutor.run, CPU of that process) and whether it loaded the
# filter plugins itself: a sitecustomize on PYTHONPATH wraps the executor in every worker of one run.
WORKER_PROBE = r"""
import os, sys, time
def _loaded():
    mods = list(sys.modules)
    return (any(m.startswith("ansible.plugins.filter.core_") for m in mods),
            sum(m.startswith("ansible_collections.sparkfleet.cluster.plugins.filter.") for m in mods))
try:
    from ansible.executor import task_executor as _te
except ImportError:
    _te = None
if _te is not None:
    _run = _te.TaskExecutor.run
    def run(self):
        before, start = _loaded(), time.process_time()
        try:
            return _run(self)
        finally:
            took, after = time.process_time() - start, _loaded()
            with open(os.environ["SPARKFLEET_BENCH_WORKERS"], "a") as out:
                out.write(f"{took:.6f} {int(after != before)}\n")
    _te.TaskExecutor.run = run
"""


def _workers(argv: list[str], env: dict[str, str], tmp: Path, name: str) -> tuple[float, int, int]:
    """(CPU seconds of every task's worker, workers, workers that loaded filter plugins themselves)."""
    probe, log = tmp / "probe", tmp / f"workers-{name}.txt"
    probe.mkdir(exist_ok=True)
    (probe / "sitecustomize.py").write_text(WORKER_PROBE)
    log.unlink(missing_ok=True)
    _timed(argv, {**env, "PYTHONPATH": str(probe), "SPARKFLEET_BENCH_WORKERS": str(log)}, 1)
    lines = [line.split() for line in log.read_text().splitlines()]
    return sum(float(cpu) for cpu, _ in lines), len(lines), sum(int(loaded) for _, loaded in lines)


def bench_lab_runs(tmp: Path) -> list[dict]:
    lab = lab_from_env()
    if lab is None:
        return []
    repeat = int(os.environ.get("SPARKFLEET_BENCH_REPEAT", "1"))
    invs = [str(p) for p in lab.inventories]
    inv_args = [a for i in invs for a in ("-i", i)]
    play = [str(BIN / "ansible-playbook"), *inv_args]
    caches = {"jsonfile": tmp / "jsonfile", "facts": tmp / "facts"}

    def env(cache: str, strategy: str, **extra: str) -> dict[str, str]:
        plugin = "ansible.builtin.jsonfile" if cache == "jsonfile" else "sparkfleet.cluster.facts"
        return _env(
            ANSIBLE_CACHE_PLUGIN=plugin,
            ANSIBLE_CACHE_PLUGIN_CONNECTION=str(caches[cache]),
            ANSIBLE_STRATEGY=strategy,
            **extra,
        )

    # each cache filled by a real run first (untimed): the same facts a converged cluster's re-run reads
    for cache in caches:
        _timed([*play, "site.yml"], env(cache, "linear"), 1)

    def row(what: str, baseline: float, candidate: float, how: str) -> dict:
        return {"name": f"{lab.topology} {what}", "baseline": baseline, "candidate": candidate, "unit": "s",
                "ratio": baseline / candidate, "how": how}  # fmt: skip

    def without(callback: str) -> dict[str, str]:  # ansible.cfg's callbacks but one
        kept = [c for c in CALLBACKS if c != callback]
        return env("facts", "linear", ANSIBLE_CALLBACKS_ENABLED=",".join(kept))

    alone = without("sparkfleet.cluster.preload")  # each task's worker loads its plugins itself
    unsurveyed = without("sparkfleet.cluster.changes")  # every phase gate makes its own round trip
    unkept = without("sparkfleet.cluster.payloads")  # every run builds its module payloads again
    unfrozen = without("sparkfleet.cluster.gc_freeze")  # every full collection walks the loaded playbook
    (tmp / "pure_yaml").mkdir(exist_ok=True)
    (tmp / "pure_yaml" / "sitecustomize.py").write_text(PURE_YAML)
    pure = env("facts", "linear", PYTHONPATH=str(tmp / "pure_yaml"))  # the roles' YAML without libyaml
    rows = []
    for book in ("playbooks/status.yml", "site.yml"):
        a = _timed([*play, book], env("jsonfile", "linear"), repeat)
        b = _timed([*play, book], env("facts", "linear"), repeat)
        m = _timed([*play, book], env("facts", "sparkfleet"), repeat)
        p = _timed([*play, book], alone, repeat)
        k = _timed([*play, book], unkept, repeat)
        f = _timed([*play, book], env("facts", "linear", ANSIBLE_INJECT_FACT_VARS="True"), repeat)
        g = _timed([*play, book], unfrozen, repeat)
        y = _timed([*play, book], pure, repeat)
        name = Path(book).name
        rows.append(
            row(
                f"no-op {name}: fact cache",
                a,
                b,
                "ansible-playbook, linear strategy: ansible.builtin.jsonfile vs sparkfleet.cluster.facts",
            )
        )
        strategies = "ansible-playbook, facts cache: mitogen (strategy sparkfleet) vs Ansible's linear"
        rows.append(row(f"no-op {name}: strategy", m, b, strategies))
        rows.append(row(f"no-op {name}: plugin preload", p, b,
                        "ansible-playbook, linear, facts cache: without vs with sparkfleet.cluster.preload "
                        "(filter and test plugins loaded once in the controller)"))  # fmt: skip
        rows.append(row(f"no-op {name}: module payloads kept", k, b,
                        "ansible-playbook, linear, facts cache: without vs with sparkfleet.cluster.payloads "
                        "(the module payloads of the run before instead of building them)"))  # fmt: skip
        rows.append(row(f"no-op {name}: facts only in ansible_facts", f, b,
                        "ansible-playbook, linear, facts cache: inject_facts_as_vars on (Ansible's "
                        "default) vs off (ansible.cfg)"))  # fmt: skip
        rows.append(row(f"no-op {name}: heap frozen before forks", g, b,
                        "ansible-playbook, linear, facts cache: without vs with sparkfleet.cluster.gc_freeze "
                        "(the loaded playbook frozen for the garbage collector at the playbook's and each "
                        "play's start)"))  # fmt: skip
        rows.append(row(f"no-op {name}: roles' YAML with libyaml", y, b,
                        "ansible-playbook, linear, facts cache: the validate and phase_state actions parse "
                        "the roles' YAML files with PyYAML's pure-Python parser vs libyaml "
                        "(plugin_utils/yaml_files.py)"))  # fmt: skip
    # what the freeze costs in memory: the peak resident set of the run's largest process, without and with it
    loose, frozen = _peak([*play, "site.yml"], unfrozen), _peak([*play, "site.yml"], env("facts", "linear"))
    rows.append({"name": f"{lab.topology} no-op site.yml: peak memory, heap frozen", "baseline": loose,
                 "candidate": frozen, "unit": "MiB", "ratio": loose / frozen,
                 "how": "the largest resident set of ansible-playbook and its workers (wait4's ru_maxrss), "
                        "without vs with sparkfleet.cluster.gc_freeze; a ratio under 1 is memory the freeze "
                        "keeps"})  # fmt: skip
    # the phase gates taking preflight layer 2's survey of their records (docs/design.md "Phase gates")
    a = _timed([*play, "site.yml"], unsurveyed, repeat)
    b = _timed([*play, "site.yml"], env("facts", "linear"), repeat)
    rows.append(row("no-op site.yml: phase survey", a, b,
                    "ansible-playbook, linear, facts cache: every gate reads its record (without "
                    "sparkfleet.cluster.changes) vs the gates take preflight layer 2's survey"))  # fmt: skip
    # the preload's own measure: what the workers of one no-op site.yml spent, without and with it
    without = _workers([*play, "site.yml"], alone, tmp, "without")
    within = _workers([*play, "site.yml"], env("facts", "linear"), tmp, "with")
    how = (
        f"TaskExecutor.run summed over a run's {without[1]} and {within[1]} worker processes, without vs "
        f"with sparkfleet.cluster.preload; workers that loaded filter plugins themselves: {without[2]} and "
        f"{within[2]}"
    )
    rows.append(
        {
            "name": f"{lab.topology} no-op site.yml: the workers' CPU, plugin preload",
            "baseline": without[0],
            "candidate": within[0],
            "unit": "s CPU",
            "ratio": without[0] / within[0],
            "how": how,
        }
    )
    # the wrapper: `sparkfleet status` vs the same playbook through plain ansible-playbook, same settings
    wrapped = _timed(
        [str(BIN / "sparkfleet"), "status", *inv_args],
        {**env("facts", "linear"), "SPARKFLEET_STRATEGY": "linear"},
        repeat,
    )
    plain = _timed(
        [*play, "-e", '{"sparkfleet_cli_tables":true}', "playbooks/status.yml"],
        env("facts", "linear"),
        repeat,
    )
    rows.append(row("status: sparkfleet over ansible-playbook", wrapped, plain,
                    "sparkfleet status vs ansible-playbook playbooks/status.yml (linear, facts cache); "
                    f"the wrapper adds {wrapped - plain:.2f} s"))  # fmt: skip
    return rows


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="sparkfleet-bench-runs-") as tmp:
        rows = bench_fact_reads(Path(tmp))
        lab_rows = bench_lab_runs(Path(tmp))
        if not lab_rows:
            print("   run benchmarks not run: they need a converged lab named by SPARKFLEET_LAB", flush=True)
    return rows + lab_rows
