"""Scale-out on Ray: each attempt (environment × agent × model × epoch) a Ray task holding its tier's
GPUs, CPUs and memory on the node that runs it, through the same harness as `openrebench eval`; a
durable queue on the driver (retries, node losses, resume); per-node asset preparation; live progress.

Ray is optional (`pip install 'openrebench[ray]'`): it is imported only when a cluster is used.
"""

from ._driver import QUEUE_FILE, ClusterEval, Driver, Outcome, connect, driver_lock, forwarded_env
from ._eval import eval_on_cluster, plan_attempts
from ._node import LOST_FILE, RESULT_FILE, START_FILE, prepare_assets, run_attempt, trivial_attempt
from ._queue import LOST_TRIES, AttemptQueue, QueuedAttempt, Try
from ._spec import AttemptSpec, Resources, attempt_resources

__all__ = [
           "LOST_FILE",
           "LOST_TRIES",
           "QUEUE_FILE",
           "RESULT_FILE",
           "START_FILE",
           "AttemptQueue",
           "AttemptSpec",
           "ClusterEval",
           "Driver",
           "Outcome",
           "QueuedAttempt",
           "Resources",
           "Try",
           "attempt_resources",
           "connect",
           "driver_lock",
           "eval_on_cluster",
           "forwarded_env",
           "plan_attempts",
           "prepare_assets",
           "run_attempt",
           "trivial_attempt",
]
