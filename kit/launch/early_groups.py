"""The default process group, created in a thread while the rank imports its engine.

Creating it is mostly waiting: for the rendezvous store, for the peers to arrive (every rank
imports torch and the engine at its own pace) and, with gloo, for the connections to them.
That wait needs no engine, and holds no GIL while it waits, so a rank starts it as soon as it
has its config and imports the engine meanwhile; the engine's ``setup`` then finds the group
made (``torch.distributed.is_initialized()``) and creates only its own subgroups.

With NCCL the thread creates the group without a device: no communicator is made there (the
engine binds none, see ``MegatronEngine.setup``), each is made at its group's first collective
on the rank's main thread, on the device that thread set. ``CHARLLM_EARLY_PROCESS_GROUP=0``
leaves the creation to the engine's ``setup`` instead (a fallback should a backend mind it).
"""

import os
import threading

import torch.distributed as dist

from kit.config.run import RunConfig

EARLY_GROUP_ENV = "CHARLLM_EARLY_PROCESS_GROUP"


def early_group_wanted() -> bool:
    """Whether ranks create the default group on a thread (unless the environment says 0)."""
    return os.environ.get(EARLY_GROUP_ENV, "1") != "0"


class EarlyProcessGroup:
    """``torch.distributed.init_process_group`` on a thread; :meth:`wait` joins it."""

    def __init__(self, cfg: RunConfig, rank: int, world_size: int) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._create, args=(cfg, rank, world_size), daemon=True,
            name="process-group")
        self._thread.start()

    def _create(self, cfg: RunConfig, rank: int, world_size: int) -> None:
        try:
            dist.init_process_group(backend=cfg.platform.torch_backend, rank=rank,
                                    world_size=world_size)
        except BaseException as e:  # re-raised in the rank's main thread by wait()
            self._error = e

    def wait(self) -> None:
        """Block until the group exists; raise what creating it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
