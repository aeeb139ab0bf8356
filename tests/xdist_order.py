"""Hand the suite's slowest files out first (``./run.sh test``: pytest-xdist, ``--dist loadfile``).

xdist gives each free worker the next file, in the order of how many tests a file has; a long
file that comes late keeps one worker busy after the others have finished (on 2026-12-06, idle,
three workers: 877, 876 and 928 s of tests, the last one holding the Slurm file's 303 s; with
only the slowest dozen named, the two-test DeepSpeed compile file came last: 901, 902, 958 s).
Largest first (the longest-processing-time rule) ends them together. The order is what the
files took then (the mean of two idle runs, three workers, on this project's 2-core CPU
machines), every file of 12 s or more; the others, 77 s in all, keep xdist's order after
them. Refresh it from ``CHARLLM_TEST_CPU`` records when the suite's shape changes.
"""

from xdist.scheduler import LoadFileScheduling

SLOWEST_FIRST = (
    "test_multinode_slurm.py",  # 322 s
    "test_megatron_parallel_cpu.py",  # 253 s
    "test_compare_report.py",  # 170 s
    "test_startup.py",  # 154 s
    "test_multinode_torchrun.py",  # 150 s
    "test_report_layouts.py",  # 132 s
    "test_projection_cpu.py",  # 129 s
    "test_profiling.py",  # 116 s
    "test_run_faults.py",  # 102 s
    "test_sweep.py",  # 96 s
    "test_stall_watchdog.py",  # 89 s
    "test_run_deepspeed.py",  # 73 s
    "test_fabric.py",  # 70 s
    "test_container.py",  # 56 s
    "test_study.py",  # 54 s
    "test_grouped_mlp.py",  # 51 s
    "test_bundle_archive.py",  # 50 s
    "test_engine_numerics.py",  # 43 s
    "test_projection.py",  # 42 s
    "test_hostile_inputs.py",  # 40 s
    "test_readme_commands.py",  # 37 s
    "test_expert_load.py",  # 36 s
    "test_run_fsdp2.py",  # 33 s
    "test_deepspeed_speed.py",  # 31 s
    "test_cli_bundle.py",  # 30 s
    "test_run_cpu.py",  # 29 s
    "test_spec_validation.py",  # 28 s
    "test_run_sh.py",  # 26 s
    "test_bundle_verified.py",  # 25 s
    "test_interop_mlperf_checkers.py",  # 24 s
    "test_telemetry_replay.py",  # 22 s
    "test_output_targets.py",  # 18 s
    "test_telemetry_nvml.py",  # 16 s
    "test_energy_counter.py",  # 16 s
    "test_rank_fork.py",  # 16 s
    "test_telemetry_host.py",  # 14 s
    "test_flops.py",  # 14 s
    "test_telemetry_amdsmi.py",  # 13 s
    "test_moe_breakdown.py",  # 13 s
    "test_memory.py",  # 13 s
)
"""Test files by the wall seconds their tests took (setup and teardown included), most
first."""


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
