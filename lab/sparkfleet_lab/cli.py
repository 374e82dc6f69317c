"""`sparkfleet lab up|down|status`: the simulated cluster (see README "The lab")."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    lab = subparsers.add_parser(
        "lab",
        help="a simulated TP2/TP3 cluster on this machine (containers as DGX Sparks)",
        description=(
            "Make, inspect or remove a lab: Docker containers that play DGX Sparks (systemd, sshd, "
            "nested Docker, ConnectX-7 interface names, an nvidia-smi simulator), cabled like real ones, "
            "with a hub that stands in for Hugging Face, a registry and git. `up` converges site.yml "
            "and runs verify against it."
        ),
    )
    sub = lab.add_subparsers(dest="lab_cmd", required=True, metavar="{up,down,status,images}")
    for cmd, text in (
        ("up", "create (or resume) the lab and provision it with site.yml; idempotent"),
        ("down", "remove the lab's containers, networks, volumes, keys and state; nothing else"),
        ("status", "list the lab's nodes, cables and addresses"),
    ):
        p = sub.add_parser(cmd, help=text, description=text)
        p.add_argument("--topology", choices=["tp2", "tp3"], help="tp3 (default) or tp2")
        p.add_argument("--name", help="lab name (default: the topology); labs with different names coexist")
        if cmd == "up":
            p.add_argument(
                "--no-converge", action="store_true", help="only make the nodes; do not run site.yml"
            )
            p.add_argument(
                "--no-verify", action="store_true", help="run site.yml but not the verify requests"
            )
            p.add_argument(
                "--nodes",
                type=int,
                help="make only the first N Sparks of the topology, cabled where both ends exist "
                "(a role scenario's small lab; it cannot run site.yml); default: all",
            )
            p.add_argument(
                "--no-hub",
                action="store_true",
                help="no hub (Hugging Face, registry and git stand-ins): for roles that download nothing",
            )
            p.add_argument(
                "--vm",
                action="store_true",
                help="Debian VMs under qemu instead of containers: real kernel, GRUB, reboots, swap, "
                'sysctls, NetworkManager and soft-RoCE (README "The VM lab"); makes the nodes and '
                "inventory, no hub, does not run site.yml",
            )
            p.add_argument(
                "--arch",
                choices=["amd64", "arm64"],
                help="with --vm: arm64 makes one arm64 node (qemu-system-aarch64, UEFI) to prove the 64k "
                "profile's page-size switch with Debian's 16K-page kernel (README \"The 64K kernel\"); "
                "default amd64",
            )
        if cmd == "status":
            p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=_run)
    text = (
        "build the lab's node and engine-base images (debootstrap + docker import, offline from the "
        "Debian mirror) if missing; cached by a content tag. `up` does this too; CI runs it beside the lint"
    )
    sub.add_parser("images", help=text, description=text).set_defaults(func=_images)


def _images(args: argparse.Namespace) -> int:
    from sparkfleet_lab import image

    try:
        images = image.ensure_images()
    except RuntimeError as exc:  # a failed debootstrap or docker build, with where its log is
        print(f"sparkfleet lab images: {exc}", file=sys.stderr)
        return 2
    print(f"node image: {images.node}\nengine base image: {images.engine_base}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from sparkfleet_lab.core import Lab, LabError
    from sparkfleet_lab.vm import lab as vm

    try:
        if (args.lab_cmd == "up" and getattr(args, "vm", False)) or (
            args.lab_cmd != "up" and args.name and vm.is_vm_lab(args.name)
        ):
            return _run_vm(args, vm)
        # Only `up` needs the topology of a lab never created: down and status work by name (labels).
        up = args.lab_cmd == "up"
        lab = Lab(
            name=args.name,
            topology_name=args.topology,
            require_topology=up,
            nodes=args.nodes if up else None,
            hub=not args.no_hub if up else None,
        )
        if up:
            partial = lab.node_count < len(lab.hosts_of_topology()) or not lab.with_hub
            if partial and not args.no_converge:
                print("sparkfleet lab: a lab with --nodes or --no-hub is not a cluster; add --no-converge",
                      file=sys.stderr)  # fmt: skip
                return 64
            return lab.up(converge=not args.no_converge, verify=not args.no_verify)
        if args.lab_cmd == "down":
            lab.down()
            return 0
        if args.json:
            print(json.dumps(lab.status(), indent=2))
        else:
            print(lab.describe() if lab.state else f"lab {lab.name}: not created")
        return 0
    except LabError as exc:
        print(f"sparkfleet lab: {exc}", file=sys.stderr)
        return 2


def _run_vm(args: argparse.Namespace, vm) -> int:
    """`lab up --vm` and down/status of a VM lab (found by its state)."""
    lab = vm.VmLab(name=args.name, topology_name=args.topology, arch=getattr(args, "arch", None))
    if args.lab_cmd == "up":
        if args.nodes or args.no_hub:
            print("sparkfleet lab: --vm makes every node of the topology and never a hub", file=sys.stderr)
            return 64
        return lab.up()
    if args.lab_cmd == "down":
        lab.down()
        return 0
    if args.json:
        print(json.dumps(lab.status(), indent=2))
    else:
        print(lab.describe() if lab.state else f"lab {lab.name}: not created")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (python -m sparkfleet_lab.cli) while the main CLI is being built."""
    parser = argparse.ArgumentParser(prog="sparkfleet")
    register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
