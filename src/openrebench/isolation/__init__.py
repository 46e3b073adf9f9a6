"""Keeping processes apart: bubblewrap sandboxes, cgroups (memory, processes, CPU, freezing), GPU
leases and PID namespaces. Used by the runs layer (the scorer's sandbox) and by the harness (the
agent's sandbox); knows nothing of environments or runs."""

from ._bwrap import (
    SANDBOX_UID,
    Bind,
    PluginCode,
    ProcessLimits,
    SandboxSpec,
    bwrap_binary,
    bwrap_command,
    bwrap_usable,
    forget_plugins,
    plugin_code,
    plugin_folders,
    sandbox_path,
)
from ._cgroup import Cgroup
from ._gpus import GpuLease, all_gpu_nodes, visible_gpus
from ._identity import allocate_uid, identities_available, identity_files
from ._janitor import janitor_pid, process_alive
from ._machine import Machine, MachineSpec, OutputLimitExceeded, SandboxDied
from ._namespace import pid_namespace_prefix
from ._quiet import acquire_slot, held_slot, measurement_slot, quiet_machine
from ._volume import IMAGE_NAME, Volume, volume_problem

__all__ = [
    "IMAGE_NAME",
    "SANDBOX_UID",
    "Bind",
    "Cgroup",
    "GpuLease",
    "Machine",
    "MachineSpec",
    "OutputLimitExceeded",
    "PluginCode",
    "ProcessLimits",
    "SandboxDied",
    "SandboxSpec",
    "Volume",
    "acquire_slot",
    "all_gpu_nodes",
    "allocate_uid",
    "bwrap_binary",
    "bwrap_command",
    "bwrap_usable",
    "forget_plugins",
    "held_slot",
    "identities_available",
    "identity_files",
    "janitor_pid",
    "measurement_slot",
    "pid_namespace_prefix",
    "plugin_code",
    "plugin_folders",
    "process_alive",
    "quiet_machine",
    "sandbox_path",
    "visible_gpus",
    "volume_problem",
]
