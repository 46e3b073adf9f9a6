"""The agent's side of an attempt, whatever isolates it: the paths it sees and the host folder behind them.

Every backend shows the agent the same places: the run's workspace at /workspace, the harness's
`score` command and socket at /run/openrebench (and, where the run has models, the gateway's socket
folder at /run/openrebench/gateway and `gateway-forward` beside `score`), and its own home, /tmp,
/opt and /var/tmp, which last for the whole attempt (a shell's files in /tmp survive between tool
calls; a human agent's tools live in /opt and its session records in /var/tmp). `AgentHome` is the
host folder holding the harness's part and the agent's own places, made once per attempt.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from openrebench.isolation import identity_files, sandbox_path

WORKSPACE = "/workspace"
HARNESS_DIR = "/run/openrebench"
GATEWAY_DIR = f"{HARNESS_DIR}/gateway"  # the model gateway's socket folder, where the run has models
GATEWAY_PORT = 4141
"""Where `OPENAI_BASE_URL` points inside a sandbox without network (its own loopback, so the same port
for every run); a command that shares the host's network gets a free port instead."""
HOME = "/home/agent"
STATE_DIRS = {"home": HOME, "tmp": "/tmp", "opt": "/opt", "var-tmp": "/var/tmp"}


@dataclass(frozen=True)
class AgentHome:
    """The host folder of one attempt: `run/` (seen as /run/openrebench: `bin/score`, `score.sock`),
    `state/<name>` (the agent's home, /tmp, /opt, /var/tmp), `etc/` (its passwd and group)."""

    root: Path
    workspace: Path

    @classmethod
    def create(cls, workspace: Path) -> AgentHome:
        root = Path(tempfile.mkdtemp(prefix="orb-"))
        root.chmod(0o755)
        home = cls(root, workspace)
        home.bin_dir.mkdir(parents=True)
        for name in STATE_DIRS:
            home.state(name).mkdir(parents=True)
        (home.state("home") / ".bashrc").write_text("PS1='agent:\\w\\$ '\n")
        # A login shell's /etc/profile resets PATH: put the harness's `score` and Python back first.
        (home.state("home") / ".profile").write_text(f"export PATH={HARNESS_DIR}/bin:{sandbox_path()}\n"
                                                     "[ -f ~/.bashrc ] && . ~/.bashrc\n")
        return home

    def write_identity(self, uid: int) -> None:
        """passwd and group files naming `uid` `agent` with home /home/agent, for tools that look the user
        up (Inspect's human agent, getpass, torch's caches)."""
        identity_files(self.etc, uid, "agent", HOME)

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def bin_dir(self) -> Path:
        return self.run_dir / "bin"

    @property
    def socket(self) -> Path:
        return self.run_dir / "score.sock"

    @property
    def gateway_mount(self) -> Path:
        """The empty folder the gateway's socket folder is bound over (bwrap cannot make it in the
        read-only /run/openrebench)."""
        return self.run_dir / "gateway"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    def state(self, name: str) -> Path:
        return self.root / "state" / name

    def owned(self) -> list[Path]:
        """The places the agent writes: the workspace and its own dirs."""
        return [self.workspace, *(self.state(name) for name in STATE_DIRS)]

    def chown(self, uid: int) -> None:
        """Give the agent's places, all they hold, to the uid its commands run as."""
        for top in self.owned():
            for root, dirs, files in os.walk(top):
                for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                    os.chown(name, uid, uid)

    def host_path(self, file: str) -> Path | None:
        """The host path of a file in the workspace or the agent's own dirs, or None elsewhere."""
        path = Path(file)
        if not path.is_absolute():
            path = Path(WORKSPACE) / path
        places = {WORKSPACE: self.workspace, **{dest: self.state(name) for name, dest in STATE_DIRS.items()}}
        for dest, base in places.items():
            if path == Path(dest) or path.is_relative_to(dest):
                rel = path.relative_to(dest)
                if ".." in rel.parts:
                    return None
                host = base / rel
                # A link the agent made must not lead the harness (which may be root) elsewhere.
                if not host.resolve().is_relative_to(base.resolve()):
                    raise PermissionError(f"{file}: leads outside {dest}")
                return host
        return None

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
