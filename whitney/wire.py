"""Pydantic models for every shape of the Whitney wire contract (docs/api.md).

Request models are strict: unknown fields, mismatched tensor shapes, NaN or infinite floats
are ValidationErrors whose location names the field. Response models accept unknown fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

RunStatus = Literal[
    "allocating", "ready", "finishing", "finished", "cancelling", "cancelled", "failed"
]
OperationStatus = Literal["pending", "running", "succeeded", "failed", "cancelled"]
Provider = Literal["modal", "tinker", "local"]
Role = Literal["policy", "critic"]

RUN_TERMINAL: frozenset[str] = frozenset({"finished", "cancelled", "failed"})
OPERATION_TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
RUN_OPERATIONS: tuple[str, ...] = (
    "forward_backward",
    "forward",
    "optim_step",
    "save_weights_for_sampler",
    "save_state",
    "load_state",
    "export_lora",
)
"""The run operation kinds, in the order the contract (and the capabilities document) lists them."""
SAMPLER_OPERATIONS: tuple[str, ...] = ("sample", "logprobs")
"""The sampler operation kinds, in the contract's order."""
RUN_OPERATION_KINDS: frozenset[str] = frozenset(RUN_OPERATIONS)
SAMPLER_OPERATION_KINDS: frozenset[str] = frozenset(SAMPLER_OPERATIONS)

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
StrictFiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]
"""A tensor value: a real number (an int is widened), never a bool, a string, NaN or infinity."""
TokenId = Annotated[StrictInt, Field(ge=0)]
StopString = Annotated[StrictStr, Field(min_length=1, max_length=256)]


class RequestModel(BaseModel):
    """A shape the client sends: strict, no unknown fields, no NaN or infinity."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ResponseModel(BaseModel):
    """A shape the server answers with: unknown fields are kept, not refused."""

    model_config = ConfigDict(extra="allow")


class Tensor(RequestModel):
    dtype: Literal["int64", "float32"]
    shape: list[Annotated[StrictInt, Field(ge=0)]] = Field(min_length=1, max_length=1)
    values: list[StrictInt] | list[StrictFiniteFloat]

    @model_validator(mode="after")
    def _values_match_shape_and_dtype(self) -> Tensor:
        if len(self.values) != self.shape[0]:
            raise ValueError(f"has {len(self.values)} values but shape {self.shape}")
        if self.dtype == "int64" and not all(type(value) is int for value in self.values):
            raise ValueError("dtype int64 needs integer values")
        return self


class ModelInput(RequestModel):
    token_ids: list[TokenId] = Field(min_length=1)


class Datum(RequestModel):
    input: ModelInput
    loss_inputs: dict[str, Tensor]

    @model_validator(mode="after")
    def _tensors_align_with_tokens(self) -> Datum:
        length = len(self.input.token_ids)
        for name, tensor in self.loss_inputs.items():
            if tensor.shape != [length]:
                raise ValueError(
                    f"loss_inputs.{name} has shape {tensor.shape} "
                    f"but input.token_ids has {length} tokens"
                )
        return self


class ForwardPayload(RequestModel):
    data: list[Datum] = Field(min_length=1)
    loss_function: str = Field(min_length=1)
    loss_config: dict[str, FiniteFloat] = Field(default_factory=dict)


class Optimizer(RequestModel):
    type: Literal["adamw"] = "adamw"
    learning_rate: FiniteFloat = Field(default=1e-4, ge=0)
    beta1: FiniteFloat = Field(default=0.9, ge=0, lt=1)
    beta2: FiniteFloat = Field(default=0.95, ge=0, lt=1)
    eps: FiniteFloat = Field(default=1e-8, gt=0)
    weight_decay: FiniteFloat = Field(default=0.0, ge=0)
    grad_clip_norm: FiniteFloat = Field(default=0.0, ge=0)


class OptimStepPayload(RequestModel):
    optimizer: Optimizer


class SamplingParams(RequestModel):
    max_tokens: int = Field(ge=1)
    temperature: FiniteFloat = Field(default=1.0, gt=0)
    top_p: FiniteFloat = Field(default=1.0, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=1)
    stop_token_ids: list[TokenId] = Field(default_factory=list)
    stop: list[StopString] = Field(default_factory=list, max_length=4)
    seed: int | None = None


class SampleRequest(RequestModel):
    prompt: ModelInput
    num_samples: int = Field(default=1, ge=1)
    sampling_params: SamplingParams


class LogprobsRequest(RequestModel):
    sequences: list[ModelInput] = Field(min_length=1)


class NamedPayload(RequestModel):
    """Payload of `save_weights_for_sampler` and `save_state`: an optional name."""

    name: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$"
    )


class LoadStatePayload(RequestModel):
    checkpoint: str = Field(min_length=1)
    with_optimizer: bool = True


class EmptyPayload(RequestModel):
    pass


PAYLOAD_MODELS: dict[str, type[RequestModel]] = {
    "forward_backward": ForwardPayload,
    "forward": ForwardPayload,
    "optim_step": OptimStepPayload,
    "save_weights_for_sampler": NamedPayload,
    "save_state": NamedPayload,
    "load_state": LoadStatePayload,
    "export_lora": EmptyPayload,
    "sample": SampleRequest,
    "logprobs": LogprobsRequest,
}


def validate_payload(kind: str, payload: dict[str, Any]) -> RequestModel:
    """Validate an operation payload against its kind's model; ValueError for an unknown kind."""
    model = PAYLOAD_MODELS.get(kind)
    if model is None:
        raise ValueError(f"unknown operation kind {kind!r}")
    return model.model_validate(payload)


SEQ_ID_LIMIT = 2**63
"""seq ids are JSON integers below this (they fit a signed 64-bit integer)."""
SeqId = Annotated[StrictInt, Field(ge=1, lt=SEQ_ID_LIMIT)]


class OperationRequest(RequestModel):
    seq_id: SeqId
    kind: str
    payload: dict[str, Any] = Field(default_factory=dict)


class SessionCreate(RequestModel):
    labels: dict[str, str] = Field(default_factory=dict)


class RunCreate(RequestModel):
    session_id: str
    provider: Provider
    base_model: str = Field(min_length=1)
    lora_rank: int = Field(default=8, ge=1)
    seed: int | None = None
    role: Role = "policy"
    trainable: bool = True
    from_checkpoint: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class SampledSequence(ResponseModel):
    tokens: list[int]
    logprobs: list[float]
    stop_reason: Literal["stop", "length"]


class SampleResult(ResponseModel):
    sequences: list[SampledSequence]
    prompt_tokens: int


class LogprobsResult(ResponseModel):
    logprobs: list[list[float | None]]


class ForwardResult(ResponseModel):
    loss: float
    metrics: dict[str, float] = Field(default_factory=dict)
    outputs: list[dict[str, list[float]]] = Field(default_factory=list)


class OptimStepResult(ResponseModel):
    step: int
    metrics: dict[str, float] = Field(default_factory=dict)


class SamplerResult(ResponseModel):
    sampler_id: str


class SaveStateResult(ResponseModel):
    checkpoint: str
    step: int


class LoadStateResult(ResponseModel):
    step: int


class ExportLoraResult(ResponseModel):
    artifact_id: str
    format: str
    sha256: str
    bytes: int


class Session(ResponseModel):
    session_id: str
    status: Literal["open", "closed"]
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: str
    run_ids: list[str] | None = None
    lease_expires_at: str | None = None
    closed_reason: str | None = None


class SessionList(ResponseModel):
    sessions: list[Session]


class Run(ResponseModel):
    run_id: str
    session_id: str
    provider: str
    base_model: str
    lora_rank: int
    role: str
    trainable: bool
    status: RunStatus
    next_seq_id: int
    step: int
    error: dict[str, Any] | None = None
    created_at: str


class Operation(ResponseModel):
    run_id: str
    seq_id: int
    kind: str
    sampler_id: str | None = None
    status: OperationStatus
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    usage: dict[str, int | float] = Field(default_factory=dict)
    submitted_at: str | None = None
    finished_at: str | None = None

    def result_as(self, model: type[ResultT]) -> ResultT:
        """The result as `model`, which must be this kind's result model (RESULT_MODELS)."""
        expected = RESULT_MODELS.get(self.kind)
        if expected is not model:
            raise ValueError(
                f"a {self.kind!r} operation's result is a "
                f"{expected.__name__ if expected else 'nothing known'}, not a {model.__name__}"
            )
        return model.model_validate(self.result or {})


ResultT = TypeVar("ResultT", bound=ResponseModel)
RESULT_MODELS: dict[str, type[ResponseModel]] = {
    "forward_backward": ForwardResult,
    "forward": ForwardResult,
    "optim_step": OptimStepResult,
    "save_weights_for_sampler": SamplerResult,
    "save_state": SaveStateResult,
    "load_state": LoadStateResult,
    "export_lora": ExportLoraResult,
    "sample": SampleResult,
    "logprobs": LogprobsResult,
}
"""The result model of each operation kind."""


class OperationList(ResponseModel):
    operations: list[Operation]


class ProviderCapabilities(ResponseModel):
    base_models: list[str]
    max_lora_rank: int
    run_operations: list[str]
    sampler_operations: list[str]


class Capabilities(ResponseModel):
    api_version: str
    providers: dict[str, ProviderCapabilities]
    limits: dict[str, int] = Field(default_factory=dict)
    """The server's request limits by name (docs/api.md, Limits); empty when it states none."""
    session_ttl_s: float | None = None
    """A session's lease: a client renews it every third of this (docs/api.md, Leases);
    0 or None: sessions never expire."""


class ErrorDetail(ResponseModel):
    type: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorBody(ResponseModel):
    error: ErrorDetail
