"""The lab's hub (part of sparkfleet_lab.core.Lab): the stand-in for the internet - the model and wheels it
serves, the engine's git repository, the registry with the engine base image - started once per lab."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request

from sparkfleet_lab import docker as d
from sparkfleet_lab import image, registry
from sparkfleet_lab.lab_base import ENGINE_BASE_REPO, HUB_PORTS, LabError


class LabHub:
    def _prepare_hub_data(self) -> dict:
        """Fill the hub's data directory; return the stand-in pins."""
        hub = self.state_dir / "hub"
        pins: dict = {}
        for sub in ("hf", "wheels", "git", "registry"):
            (hub / sub).mkdir(parents=True, exist_ok=True)
        from sparkfleet_lab import engine
        from sparkfleet_lab.hub import models, wheels

        size_mb = int(os.environ.get("SPARKFLEET_LAB_MODEL_MB", "48"))
        pins.update(models.generate(hub, self.topology, size_mb))
        wheels.prepare(hub)
        eng = engine.make_repo(hub / "git")
        version = engine.VERSION_BY_TOPOLOGY[self.topology]  # the engine version the topology's profile runs
        pins["engine"] = {
            "repo": f"git://{self.hub_ip}/{eng['repo'].lstrip('/')}",
            "commit": eng["commits"][version],
        }
        return pins

    def _ensure_hub(self, images: image.Images) -> None:
        if "pins" not in self.state:
            self.state["pins"] = self._prepare_hub_data()
            self._save_state()
        info = d.inspect("container", self.hub_container)
        if info is None:
            self.say(f"starting hub {self.hub_container} at {self.hub_ip}")
            d.docker(
                "run",
                "-d",
                "--name",
                self.hub_container,
                "--hostname",
                "hub",
                *self._labels("hub"),
                "--network",
                self.mgmt_network,
                "--ip",
                self.hub_ip,
                "--init",
                "-e",
                "PYTHONPATH=/opt/sparkfleet-lab/pkg",
                "-v",
                f"{self.project_dir / 'lab' / 'sparkfleet_lab'}:/opt/sparkfleet-lab/pkg/sparkfleet_lab:ro",
                "-v",
                f"{self.state_dir / 'hub'}:/srv/hub",
                images.node,
                "python3",
                "-m",
                "sparkfleet_lab.hub.main",
                "--data",
                "/srv/hub",
            )
        elif not info["State"]["Running"]:
            d.docker("start", self.hub_container)
        self._wait_http(f"http://{self.hub_ip}:{HUB_PORTS['registry']}/v2/", "hub registry")
        self._wait_http(f"http://{self.hub_ip}:{HUB_PORTS['hf']}/", "hub web server")
        if "base_image" not in self.state["pins"]:
            tag = images.engine_base.split(":")[-1]
            self.say(f"pushing {images.engine_base} to the hub registry")
            digest = registry.push(
                images.engine_base, f"{self.hub_ip}:{HUB_PORTS['registry']}", ENGINE_BASE_REPO, tag
            )
            self.state["pins"]["base_image"] = {
                "name": f"{self.hub_ip}:{HUB_PORTS['registry']}/{ENGINE_BASE_REPO}",
                "digest": digest,
            }
            self._save_state()

    def _wait_http(self, url: str, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=3):  # noqa: S310 - the lab's own hub
                    return
            except urllib.error.HTTPError:
                return  # it answered
            except OSError as exc:
                last = exc
                time.sleep(0.5)
        logs = d.docker("logs", "--tail", "30", self.hub_container, check=False)
        raise LabError(f"{what} at {url} did not answer within {timeout:.0f} s ({last}); hub log:\n{logs}")
