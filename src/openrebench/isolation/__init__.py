"""Keeping processes apart: bubblewrap sandboxes, cgroups (memory, processes, CPU, freezing), GPU
leases and PID namespaces. Used by the runs layer (the scorer's sandbox) and by the harness (the
agent's sandbox); knows nothing of environments or runs."""

from ._bwrap import (
    SANDBOX_UID,
    Bind,
    Limits,
    PluginCode,
    SandboxSpec,
    bwrap_binary,
    bwrap_command,
    bwrap_usable,
    forget_plugins,
    plugin_code,
    plugin_folders,
)
from ._cgroup import Cgroup
from ._gpus import GpuLease, visible_gpus
from ._janitor import janitor_pid, process_alive

__all__ = [
    "SANDBOX_UID",
    "Bind",
    "Cgroup",
    "GpuLease",
    "Limits",
    "PluginCode",
    "SandboxSpec",
    "bwrap_binary",
    "bwrap_command",
    "bwrap_usable",
    "forget_plugins",
    "janitor_pid",
    "plugin_code",
    "plugin_folders",
    "process_alive",
    "visible_gpus",
]
