"""Hand the suite's slowest files out first (``./run.sh test``: pytest-xdist, ``--dist loadfile``).

xdist gives each free worker the next file, in the order of how many tests a file has; a long
file that comes late keeps one worker busy after the others have finished (on 2026-12-06, idle,
three workers: 877, 876 and 928 s of tests, the last one holding the Slurm file's 303 s).
Largest first (the longest-processing-time rule) ends them together. The order is what the
files took then, idle, on this project's 2-core CPU machines; a file not named keeps xdist's
order after them. Refresh it from ``CHARLLM_TEST_CPU`` records when the suite's shape changes.
"""

from xdist.scheduler import LoadFileScheduling

SLOWEST_FIRST = (
    "test_multinode_slurm.py",  # 303 s
    "test_megatron_parallel_cpu.py",  # 239 s
    "test_compare_report.py",  # 149 s
    "test_multinode_torchrun.py",  # 144 s
    "test_startup.py",  # 137 s
    "test_run_faults.py",  # 117 s
    "test_projection_cpu.py",  # 117 s
    "test_profiling.py",  # 109 s
    "test_report_layouts.py",  # 106 s
    "test_stall_watchdog.py",  # 97 s
    "test_sweep.py",  # 91 s
    "test_run_deepspeed.py",  # 91 s
    "test_fabric.py",  # 80 s
    "test_container.py",  # 66 s
    "test_bundle_archive.py",  # 59 s
    "test_study.py",  # 51 s
    "test_projection.py",  # 44 s
    "test_expert_load.py",  # 43 s
    "test_engine_numerics.py",  # 43 s
    "test_hostile_inputs.py",  # 43 s
    "test_grouped_mlp.py",  # 41 s
    "test_readme_commands.py",  # 40 s
    "test_run_fsdp2.py",  # 39 s
    "test_run_cpu.py",  # 35 s
)
"""Test files by the wall seconds their tests took, most first."""


def _rank(scope: str) -> int:
    """A file's place in :data:`SLOWEST_FIRST`; files not named come after all of them."""
    name = scope.rsplit("/", 1)[-1]
    return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)


class SlowestFirstScheduling(LoadFileScheduling):
    """``--dist loadfile``, the next file to hand out being the slowest one left."""

    def _assign_work_unit(self, node) -> None:  # noqa: ANN001 (xdist's WorkerController)
        # min() keeps the queue's own order among equals (files not named)
        slowest = min(self.workqueue, key=_rank)
        self.workqueue.move_to_end(slowest, last=False)
        super()._assign_work_unit(node)
