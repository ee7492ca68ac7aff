"""A containerd of the tests' own (its root, state and socket in a temporary folder, no CRI plugin), and ``ctr``
to import the images' archives and run them under runc, as a kubelet's containerd would."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

NAMESPACE = "k8s.io"  # the namespace a kubelet's containerd keeps images in


class Containerd:
    """``containerd`` started with everything under ``folder``; stop it with :meth:`stop`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = folder / "containerd.sock"
        config = folder / "config.toml"
        folder.mkdir(parents=True, exist_ok=True)
        config.write_text(
            "version = 2\n"
            f'root = "{folder / "root"}"\n'
            f'state = "{folder / "state"}"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.socket}"\n'
            f'[ttrpc]\n  address = "{self.socket}.ttrpc"\n'
        )
        self.log = folder / "containerd.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while self.ctr("version", check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def ctr(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done

    def images(self) -> list[str]:
        return self.ctr("images", "list", "--quiet").stdout.split()

    def remove_container(self, name: str) -> None:
        """Kill the container's task (if any), then delete the task and the container."""
        if self.ctr("task", "kill", "--signal", "SIGKILL", name, check=False).returncode == 0:
            deadline = time.monotonic() + 30
            while "RUNNING" in self.ctr("task", "list").stdout.split(name, 1)[-1].split("\n", 1)[0]:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        self.ctr("task", "delete", "--force", name, check=False)
        self.ctr("container", "delete", name, check=False)

    def stop(self) -> None:
        for name in self.ctr("container", "list", "--quiet", check=False).stdout.split():
            self.remove_container(name)
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
