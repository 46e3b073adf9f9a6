"""The model gateway: the OpenAI HTTP API for code that runs where the network and the keys are not.

Some environments call a language model from inside the network-less sandbox: the agent's code, or a
scorer that grades with a model. They get no provider key and no network. Instead the harness runs a
gateway on a Unix socket that the sandbox sees (and, for unmodified clients, `gateway-forward` relays
127.0.0.1:PORT inside the sandbox to it). The gateway speaks OpenAI's API (`/v1/chat/completions`,
`/v1/completions`, `/v1/responses`, `/v1/models`; streamed or whole), so any OpenAI client works with a
base URL and a token.

- Keys stay in the harness: a backend (`InspectBackend` for any Inspect provider,
  `OpenAICompatibleBackend` for llama.cpp, vLLM or a hosted API) holds them; a run holds only a bearer
  token that the harness granted (`Gateway.grant`) and can revoke.
- A grant names roles (`task_model`, say), each bound to one model: a run reaches those and no other,
  and `/v1/models` lists only them.
- Every model request, refused ones included, is one JSON line in the run's usage log (time, run,
  role, model, endpoint, tokens in and out, cost, latency, status, error); the log's totals are what
  the run's budget (dollars, tokens) is checked against, so a restarted gateway keeps counting.

The harness serves every run from one process-wide `ModelService` (`model_service()`): one gateway
thread on one socket, backends made per model spec (`local`: the offline Gemma server), grants per run
and phase, restarted with its grants if its thread dies.

Prices (US$ per million tokens) come from `--prices`, Inspect's model data or the list-price table in
`_prices.py`, which the harness's cost estimate uses too.
"""

from ._backends import (
    BackendError,
    BackendUnavailable,
    ModelBackend,
    OpenAICompatibleBackend,
    Unsupported,
)
from ._forwarder import exec_prefix, forwarder_command, install_forwarder
from ._inspect import InspectBackend
from ._local import INSPECT_MODEL as LOCAL_INSPECT_MODEL
from ._local import MODEL_NAME as LOCAL_MODEL_NAME
from ._local import LocalModelServer
from ._local_file import local_model_path
from ._local_share import HELD_OUT_SERVER, OPEN_SERVER, LocalEndpoint, shared_local_server
from ._prices import LIST_PRICES, LOCAL_PROVIDERS, PRICES_DATE, find_price, load_prices
from ._server import Budget, Gateway, GatewayThread, Grant, RoleModel
from ._service import SOCKET_NAME, USAGE_LOG, ModelService, model_service
from ._usage import Totals, UsageLog, summarise

__all__ = [
    "HELD_OUT_SERVER",
    "LIST_PRICES",
    "LOCAL_INSPECT_MODEL",
    "LOCAL_MODEL_NAME",
    "LOCAL_PROVIDERS",
    "OPEN_SERVER",
    "PRICES_DATE",
    "SOCKET_NAME",
    "USAGE_LOG",
    "BackendError",
    "BackendUnavailable",
    "Budget",
    "Gateway",
    "GatewayThread",
    "Grant",
    "InspectBackend",
    "LocalEndpoint",
    "LocalModelServer",
    "ModelBackend",
    "ModelService",
    "OpenAICompatibleBackend",
    "RoleModel",
    "Totals",
    "Unsupported",
    "UsageLog",
    "exec_prefix",
    "find_price",
    "forwarder_command",
    "install_forwarder",
    "load_prices",
    "local_model_path",
    "model_service",
    "shared_local_server",
    "summarise",
]
