"""The `none` backend: no isolation at all, only where asked for by name (`--isolation none`), said loudly
each time and marked in the results table.

The agent's commands run as the harness's user, on the host, in the run's workspace, with the network;
it can read protected data and the reference solutions. Scorings are not sandboxed either. Where the run
has models, each command starts through `gateway-forward --exec` on a free port of the host's loopback
(commands and attempts run side by side there), which sets OPENAI_BASE_URL; the run's token is
OPENAI_API_KEY, in place of any key of the harness's. For development of the harness on a machine with no
sandbox; never for a measurement.
"""

from __future__ import annotations

import os
import shlex
import sys

from openrebench.gateway import exec_prefix

from .._layout import WORKSPACE
from ._base import Backend, Launch, login_shell

NONE_WARNING = ("openrebench sandbox 'none': NOTHING IS ISOLATED. The agent's commands run as you, "
                "on your files, with the network; it can read protected data and the reference "
                "solutions. Its scores measure nothing.")


class NoneBackend(Backend):
    name = "none"
    description = "no isolation: commands run as you, on the host, with the network (only by name, loudly)"
    warning = NONE_WARNING
    isolating = False
    serves_models = True

    def command(self, cmd: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
                interactive: bool = False) -> Launch:
        """`cmd` itself, in the host folder behind `cwd` (the workspace where it has none)."""
        home = self.attempt.home
        outside = cwd if cwd and cwd.startswith("/") else home.workspace  # nothing isolates: any folder
        host_cwd = home.host_path(cwd or WORKSPACE) or outside
        base = dict(os.environ)
        if (models := self.attempt.models) is not None:
            base.update(models.env())
            cmd = [*exec_prefix(models.socket_dir / models.socket_name, 0,
                                forwarder=home.bin_dir / "gateway-forward", python=sys.executable), *cmd]
        return Launch(cmd, cwd=str(host_cwd), env={**base, **(env or {})})

    def login(self, ready: tuple[str, str] | None = None) -> str:
        return f"cd {shlex.quote(str(self.attempt.home.workspace))} && {shlex.join(login_shell(ready))}"


BACKEND = NoneBackend
