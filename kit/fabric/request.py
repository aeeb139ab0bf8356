"""The options of ``charllm-kit fabric``, defined once (kit.cli.commands generates them from
here)."""

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.config.loader import describe_validation_error
from kit.config.run import Launcher
from kit.errors import KitInputError
from kit.plan.resolve import RunRequest

_RUN = RunRequest.model_fields


class FabricRequest(BaseModel):
    """What ``charllm-kit fabric`` was asked: the one definition of its options.

    The command generates its options from these fields (kit/cli/options.py); the launcher
    and node fields are ``run``'s own (the same names, checks and help), since a fabric run
    goes through the same launchers.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    platform: str | None = _RUN["platform"]
    nproc: int | None = Field(
        None, gt=0, description="Ranks per node (default: 2 on cpu, every device of a GPU node).")
    sizes: str | None = Field(
        None, description="Message sizes, e.g. 4K,1M,256M (default: 1K..4M on cpu, 1K..1G on "
        "GPUs).")
    ops: str | None = Field(
        None, description="Collectives, comma-separated, of all_reduce, all_gather, "
        "reduce_scatter, all_to_all, send_recv (default: all).")
    iters: int = Field(20, gt=0, description="Timed operations per size, at least: small "
                       "messages get more, up to 50x, to move 64 MiB per point.")
    warmup: int = Field(5, ge=0, description="Untimed operations before them.")
    graph: bool = Field(
        True, description="On CUDA devices, also time each point replayed from a CUDA graph "
        "(nccl-tests' -G), without the host's launch cost that dominates small messages.")
    telemetry_interval_ms: int = _RUN["telemetry_interval_ms"]
    launcher: Launcher = _RUN["launcher"]
    nodes: int = _RUN["nodes"]
    node_rank: int | None = _RUN["node_rank"]
    rdzv_endpoint: str | None = _RUN["rdzv_endpoint"]
    rdzv_timeout: int = _RUN["rdzv_timeout"]


def fabric_request(**fields: object) -> FabricRequest:
    """Build a :class:`FabricRequest`, turning a validation failure into one-line bad input."""
    try:
        return FabricRequest(**fields)  # type: ignore[arg-type]
    except ValidationError as e:
        raise KitInputError(f"invalid fabric options: {describe_validation_error(e)}") from None
