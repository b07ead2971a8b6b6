"""The API's request and response bodies (they make the OpenAPI spec)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from peakmem.service.jobs import DEFAULT_GPU

Status = Literal["queued", "running", "done", "failed"]


def _encodable(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode (a lone surrogate)") from None
    return value


def _no_controls(value: str) -> str:
    if any(ord(ch) < 32 and ch not in "\t" for ch in value) or "\x7f" in value:
        raise ValueError("control characters are not allowed")
    return _encodable(value)


def _known_fields(model: type[BaseModel], data: Any) -> Any:
    """`data` (a request object before validation) unless it has keys `model` does not know:
    one error naming a few of them and their count. pydantic's `extra="forbid"` makes one
    error per unknown key: a body of 10^6 keys took 50 s to refuse (a million errors built,
    then cut to 20)."""
    if isinstance(data, dict):
        unknown = [key for key in data if key not in model.model_fields]
        if unknown:
            shown = ", ".join(repr(key)[:40] for key in unknown[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise ValueError(f"unknown field(s) {shown}{more}; the fields are "
                             f"{', '.join(model.model_fields)}")
    return data


class EstimateOptions(BaseModel):
    """The `peakmem estimate` options a request may set (the service caps timeout and memory)."""

    model_config = ConfigDict(extra="forbid")
    steps: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | Literal["all"] | None = Field(
        None, description="optimizer steps to run, or 'all'")
    mode: Literal["fake", "eager", "auto"] | None = None
    timeout: float | None = Field(None, gt=0, le=86400, allow_inf_nan=False,
                                  description="seconds (at most the service's limit)")
    alloc_conf: str | None = Field(None, max_length=1000, description="PYTORCH_CUDA_ALLOC_CONF")
    torch: str | None = Field(None, max_length=40, pattern=r"^[0-9][0-9A-Za-z.+-]*$",
                              description="target PyTorch version")
    max_host_memory: StrictInt | None = Field(None, gt=0, le=2**50,
                                              description="bytes (at most the service's limit)")

    @model_validator(mode="before")
    @classmethod
    def _fields(cls, data: Any) -> Any:
        return _known_fields(cls, data)

    @field_validator("alloc_conf")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        return value if value is None else _no_controls(value)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class EstimateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: dict[str, str] = Field(default_factory=dict, description="path -> text of each file")
    command: list[str] = Field(..., min_length=1, max_length=256,
                               examples=[["python", "train.py", "--batch-size", "8"]])
    gpu: str = Field(DEFAULT_GPU, pattern=r"^[A-Za-z0-9._-]{1,64}$", description="GPU profile")
    options: EstimateOptions = Field(default_factory=EstimateOptions)

    @model_validator(mode="before")
    @classmethod
    def _fields(cls, data: Any) -> Any:
        return _known_fields(cls, data)

    @field_validator("command")
    @classmethod
    def _words(cls, words: list[str]) -> list[str]:
        for word in words:
            if len(word) > 4096:
                raise ValueError("a command word is longer than 4096 characters")
            if "\x00" in word:
                raise ValueError("a command word holds a NUL character")
            _encodable(word)
        return words


class Submitted(BaseModel):
    id: str
    status: Status


class ErrorObject(BaseModel):
    kind: str
    message: str
    exit_code: int
    reason: str | None = None
    job_exit_code: int | None = None
    signal: str | None = None
    traceback: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorObject


class Detail(BaseModel):
    detail: str


class EstimateStatus(BaseModel):
    id: str
    status: Status
    result: dict[str, Any] | None = Field(None, description="`peakmem estimate --json` output")
    error: ErrorObject | None = None
    attempts: int = 0
    sandbox: str | None = Field(None, description="the sandbox the job ran in, or 'none'")


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    sandbox: str
    sandbox_note: str
    workers: int
    queued: int
    running: int
    max_queue: int
