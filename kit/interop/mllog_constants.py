"""The mllog names the MLLOG export uses, and the kit's own keys beside them.

Every name without the ``KIT_`` prefix is spelled and valued as in
``mlperf_logging.mllog.constants`` (checked against mlperf-logging 4.1.68). The values are
copied rather than imported: mlperf-logging is a test dependency, not a runtime one, and the
export must not change with whichever version happens to be installed.
``tests/test_interop_mlperf_checkers.py`` asserts each value equals the package's, and that no
``KIT_`` key is one mllog defines, so a key the package adds later moves to its name.
"""

# Event types.
INTERVAL_START = "INTERVAL_START"
INTERVAL_END = "INTERVAL_END"
POINT_IN_TIME = "POINT_IN_TIME"

# Values.
OPEN = "open"
RESEARCH = "research"
ADAMW = "adamw"
SUCCESS = "success"
ABORTED = "aborted"

# Submission.
SUBMISSION_BENCHMARK = "submission_benchmark"
SUBMISSION_ORG = "submission_org"
SUBMISSION_DIVISION = "submission_division"
SUBMISSION_STATUS = "submission_status"
SUBMISSION_PLATFORM = "submission_platform"

# Timeline.
INIT_START = "init_start"
INIT_STOP = "init_stop"
RUN_START = "run_start"
RUN_STOP = "run_stop"
BLOCK_START = "block_start"
BLOCK_STOP = "block_stop"

# Run configuration.
SEED = "seed"
GLOBAL_BATCH_SIZE = "global_batch_size"
MICRO_BATCH_SIZE = "micro_batch_size"
GRADIENT_ACCUMULATION_STEPS = "gradient_accumulation_steps"
MAX_SEQUENCE_LENGTH = "max_sequence_length"
OPT_NAME = "opt_name"
OPT_BASE_LR = "opt_base_learning_rate"
TENSOR_PARALLELISM = "tensor_parallelism"
PIPELINE_PARALLELISM = "pipeline_parallelism"
CONTEXT_PARALLELISM = "context_parallelism"
EXPERT_PARALLELISM = "expert_parallelism"
LOWEST_NUMERICAL_PRECISION_IN_LINEAR = "lowest_numerical_precision_in_linear"
LOWEST_NUMERICAL_PRECISION_IN_ATTN = "lowest_numerical_precision_in_attn"
LOWEST_NUMERICAL_PRECISION_IN_COMM = "lowest_numerical_precision_in_comm"
CONFIG_FILENAME = "config_filename"

# Metadata.
STATUS = "status"
STEP_NUM = "step_num"
SAMPLES_COUNT = "samples_count"

# The kit's own keys: mllog defines no name for these.
KIT_DATA_PARALLEL_SIZE = "data_parallel_size"
"""Data-parallel replicas (mllog logs tensor, pipeline, context and expert degrees only)."""
KIT_TRAIN_LOSS = "train_loss"
"""Training loss at the end of a block (mllog has only evaluation metrics)."""
KIT_STATUS = "kit_status"
"""``run_stop`` metadata: the bundle's own status (ok, failed, oom, interrupted)."""
