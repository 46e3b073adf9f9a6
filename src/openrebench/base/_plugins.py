"""The entry-point group of environment plug-ins: the registry (runs) loads them from it, and the
sandboxes (isolation) find their code through it, so the name lives below both."""

ENVIRONMENT_ENTRY_POINT_GROUP = "openrebench.environments"
