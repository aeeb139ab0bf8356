"""The default process group, created in a thread while the rank imports its engine.

Creating it is mostly waiting: for the rendezvous store, for the peers to arrive (every rank
imports torch and the engine at its own pace) and, with gloo, for the connections to them.
That wait needs no engine, and holds no GIL while it waits, so a rank starts it as soon as it
has its config and imports the engine meanwhile; the engine's ``setup`` then finds the group
made (``torch.distributed.is_initialized()``) and creates only its own subgroups.
"""

import threading

import torch
import torch.distributed as dist

from kit.spec.run import RunConfig


class EarlyProcessGroup:
    """``torch.distributed.init_process_group`` on a thread; :meth:`wait` joins it."""

    def __init__(self, cfg: RunConfig, rank: int, local_rank: int, world_size: int) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._create, args=(cfg, rank, local_rank, world_size), daemon=True,
            name="process-group")
        self._thread.start()

    def _create(self, cfg: RunConfig, rank: int, local_rank: int, world_size: int) -> None:
        try:
            if not cfg.platform.is_cpu:
                # this thread's device (each thread has its own): the group is created the
                # way the engine would create it after its own set_device
                torch.cuda.set_device(local_rank)
            # No device_id: see MegatronEngine.setup (groups connect at their first collective)
            dist.init_process_group(backend=cfg.platform.torch_backend, rank=rank,
                                    world_size=world_size)
        except BaseException as e:  # re-raised in the rank's main thread by wait()
            self._error = e

    def wait(self) -> None:
        """Block until the group exists; raise what creating it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
