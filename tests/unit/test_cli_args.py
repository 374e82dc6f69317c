"""Argument parsing, verb → playbook mapping, -e forms, project discovery, the lab hook."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from sparkfleet import cli, cli_parser
from sparkfleet.api import PLAYBOOKS
from sparkfleet.runner import RunnerError, find_project

REPO = Path(__file__).resolve().parents[2]

# docs/CONTRACTS.md "CLI verbs → playbooks".
CONTRACT = {
    "up": "site.yml",
    "preflight": "playbooks/preflight.yml",
    "network": "playbooks/network.yml",
    "host": "playbooks/host.yml",
    "host-status": "playbooks/host_status.yml",
    "reboot": "playbooks/reboot.yml",
    "weights": "playbooks/weights.yml",
    "engine": "playbooks/engine.yml",
    "start": "playbooks/start.yml",
    "stop": "playbooks/stop.yml",
    "status": "playbooks/status.yml",
    "verify": "playbooks/verify.yml",
}


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


@pytest.mark.parametrize(("verb", "playbook"), sorted(CONTRACT.items()))
def test_every_verb_maps_to_its_playbook(verb: str, playbook: str) -> None:
    args = parse(verb, "-i", "inventory/tp3")
    assert args.playbook == playbook == PLAYBOOKS[verb]
    assert args.func is cli._run_verb
    assert args.inventories == ["inventory/tp3"]
    assert (args.check, args.diff, args.json, args.verbosity) == (False, False, False, 0)


def test_all_run_options() -> None:
    args = parse(
        "up",
        "-i",
        "inventory/tp3",
        "-i",
        ".lab/tp3/inventory",
        "--check",
        "--diff",
        "--limit",
        "spark2",
        "--tags",
        "weights",
        "--skip-tags",
        "slow",
        "-e",
        "a=1",
        "-e",
        "b=2",
        "-vv",
        "--json",
    )
    assert args.inventories == ["inventory/tp3", ".lab/tp3/inventory"]  # order kept: later wins
    assert (args.check, args.diff, args.limit, args.tags, args.skip_tags) == (
        True,
        True,
        "spark2",
        "weights",
        "slow",
    )
    assert args.extra_vars == ["a=1", "b=2"] and args.verbosity == 2 and args.json


def test_clocks_subcommands() -> None:
    s = parse("clocks", "set", "2400", "-i", "inv")
    assert (s.playbook, s.mhz, s.verb_tags) == ("playbooks/clocks.yml", 2400, None)
    r = parse("clocks", "reset", "-i", "inv")
    assert r.verb_vars == {"gpu_clocks_cap_mhz": 0}
    show = parse("clocks", "show", "-i", "inv")
    assert show.verb_tags == "show" and show.verb_vars == {}


def test_reboot_is_permission_to_reboot_and_force_is_explicit() -> None:
    r = parse("reboot", "-i", "inv")
    assert r.verb_vars == {"host_tuning_reboot": "allowed"} and r.force is False
    assert parse("reboot", "--force", "-i", "inv").force is True


def test_run_takes_a_playbook() -> None:
    args = parse("run", "tests/unit/playbooks/reach.yml", "-i", "x")
    assert args.playbook == "tests/unit/playbooks/reach.yml" and args.verb == "run"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["up"],  # -i is required
        ["clocks", "set", "0", "-i", "inv"],
        ["clocks", "set", "fast", "-i", "inv"],
        ["clocks", "-i", "inv"],
        ["frobnicate", "-i", "inv"],
    ],
)
def test_usage_errors_exit_64_not_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # 2 means "failed hosts"; a bad command line must not look like that.
    assert cli.main(argv) == cli.EXIT_USAGE == 64
    err = capsys.readouterr().err
    assert "usage: sparkfleet" in err


def test_help_says_what_each_verb_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    top = capsys.readouterr().out
    for verb in [*CONTRACT, "clocks", "run", "lab"]:
        assert f"    {verb} " in top, verb
    assert "130 (interrupted)" in top
    for verb, playbook in CONTRACT.items():
        assert cli.main([verb, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
        assert f"Runs {playbook}." in text and "--check" in text and "--json" in text
    assert cli.main(["clocks", "set", "--help"]) == 0
    assert "gpu_clocks_cap_mhz=MHZ" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("sparkfleet ")


def test_extravars_forms(tmp_path: Path) -> None:
    varsfile = tmp_path / "vars.yml"
    varsfile.write_text("from_file: 1\nshared: file\n")
    merged = cli.parse_extravars(
        ["a=1 b='two words'", '{"json": [1, 2], "shared": "json"}', f"@{varsfile}", "shared=last"]
    )
    assert merged == {"a": "1", "b": "two words", "json": [1, 2], "from_file": 1, "shared": "last"}
    for bad in ["novalue", "{not: [valid", "[1, 2]", f"@{tmp_path / 'missing.yml'}"]:
        with pytest.raises(ValueError, match="-e"):
            cli.parse_extravars([bad])


def test_bad_extravars_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "-i", "inventory/tp3", "-e", "novalue"]) == 64
    assert "expected key=value" in capsys.readouterr().err


def test_missing_inventory_exit_1_before_ansible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["run", "tests/unit/playbooks/reach.yml", "-i", str(tmp_path / "nope"), "--project-dir", str(REPO)]
    )
    assert code == 1
    assert "inventory not found" in capsys.readouterr().err


def make_project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "site.yml").write_text("---\n")
    (root / "ansible.cfg").write_text("[defaults]\n")
    return root


def test_project_discovery_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = make_project(tmp_path / "explicit")
    from_env = make_project(tmp_path / "env")
    from_cwd = make_project(tmp_path / "cwd")
    (from_cwd / "deep" / "er").mkdir(parents=True)
    monkeypatch.chdir(from_cwd / "deep" / "er")
    monkeypatch.setenv("SPARKFLEET_PROJECT", str(from_env))
    assert find_project(explicit) == explicit.resolve()
    assert find_project() == from_env.resolve()
    monkeypatch.delenv("SPARKFLEET_PROJECT")
    assert find_project() == from_cwd.resolve()  # a parent of the cwd
    monkeypatch.chdir(tmp_path)
    assert find_project() == REPO  # this package's own checkout
    with pytest.raises(RunnerError, match="not a sparkfleet project"):
        find_project(tmp_path)


def test_lab_hook_registers_lab_commands() -> None:
    args = parse("lab", "status", "--topology", "tp2")
    assert args.lab_cmd == "status" and callable(args.func)
    images = parse("lab", "images")
    assert images.lab_cmd == "images" and images.func is not args.func


def test_lab_images_reports_a_failed_build(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from sparkfleet_lab import image

    def broken() -> None:
        raise RuntimeError("debootstrap failed (exit 1); log /tmp/x.log")

    monkeypatch.setattr(image, "ensure_images", broken)
    assert cli.main(["lab", "images"]) == 2
    assert "sparkfleet lab images: debootstrap failed (exit 1); log /tmp/x.log" in capsys.readouterr().err


def test_lab_hook_tolerates_a_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_parser.importlib.util, "find_spec", lambda name: None)
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "lab" not in subparsers.choices and "up" in subparsers.choices


def test_lab_hook_reports_a_broken_module(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import sparkfleet_lab.cli as labcli

    def broken(subparsers: object) -> None:
        raise RuntimeError("lab is half written")

    monkeypatch.setattr(labcli, "register", broken)
    assert cli.main(["lab", "up"]) == 1
    assert "lab is half written" in capsys.readouterr().err
