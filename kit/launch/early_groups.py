"""The default process group, created in a thread while the rank imports its engine.

Creating it is mostly waiting: for the rendezvous store, for the peers to arrive (every rank
imports torch and the engine at its own pace) and, with gloo, for the connections to them.
That wait needs no engine, and holds no GIL while it waits, so a rank starts it as soon as it
has its config and imports the engine meanwhile; the engine's ``setup`` then finds the group
made (``torch.distributed.is_initialized()``) and creates only its own subgroups.

Only on the CPU platform (gloo) so far: with NCCL the engine still creates the group in its
``setup``, until a GPU run has shown the threaded creation (the thread's own current device,
the communicators made later on the main thread's) to work there; no GPU time was left to run
that check in the session that wrote this.
"""

import threading

import torch.distributed as dist

from kit.spec.run import RunConfig


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
