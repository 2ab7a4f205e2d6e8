"""The Whitney SDK: wire types, a client, and the datum, advantage, payload and loss
helpers. Imports neither prefect nor torch."""

from importlib.metadata import PackageNotFoundError, version

from whitney import errors, wire
from whitney.advantages import (
    all_zero,
    group_mean_advantages,
    kl_adjust_advantages,
    leave_one_out_baseline,
    length_normalize,
)
from whitney.client import WhitneyClient
from whitney.datums import Datum, Tensor, rl_datum, sft_datum, tensor
from whitney.errors import (
    Conflict,
    IdempotencyConflict,
    InternalError,
    InvalidDatum,
    InvalidLossConfig,
    InvalidRequest,
    NotFound,
    OperationFailed,
    OperationTimeout,
    RateLimited,
    RunNotActive,
    SeqConflict,
    SeqGap,
    ServerError,
    TransportError,
    Unauthorized,
    Unavailable,
    Unprocessable,
    UnsupportedLoss,
    WhitneyError,
)
from whitney.losses import (
    MODAL_LOSS_CONFIG_KEYS,
    PROVIDER_LOSS_SUPPORT,
    require_advertised_loss,
    validate_loss_config,
)
from whitney.payloads import (
    adamw_optimizer,
    forward_backward_payload,
    result_sampler_id,
    sample_request,
)

try:
    __version__ = version("whitney-flows")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "MODAL_LOSS_CONFIG_KEYS",
    "PROVIDER_LOSS_SUPPORT",
    "Conflict",
    "Datum",
    "IdempotencyConflict",
    "InternalError",
    "InvalidDatum",
    "InvalidLossConfig",
    "InvalidRequest",
    "NotFound",
    "OperationFailed",
    "OperationTimeout",
    "RateLimited",
    "RunNotActive",
    "SeqConflict",
    "SeqGap",
    "ServerError",
    "Tensor",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
    "UnsupportedLoss",
    "WhitneyClient",
    "WhitneyError",
    "__version__",
    "adamw_optimizer",
    "all_zero",
    "errors",
    "forward_backward_payload",
    "group_mean_advantages",
    "kl_adjust_advantages",
    "leave_one_out_baseline",
    "length_normalize",
    "require_advertised_loss",
    "result_sampler_id",
    "rl_datum",
    "sample_request",
    "sft_datum",
    "tensor",
    "validate_loss_config",
    "wire",
]
