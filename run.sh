#!/usr/bin/env bash
# charllm-kit for people: set up a virtual environment when needed, then run.
#
#   ./run.sh                         train the default small workload on this host, write a bundle
#   ./run.sh --platform h100 [...]   same, on a named platform (options go to `charllm-kit run`)
#   ./run.sh gpt3-small --tp 2       any workload and `charllm-kit run` options
#   ./run.sh test                    run the test suite (what CI runs)
#   ./run.sh test --fast             the tests that start no ranks, Slurm cluster or image build
#   ./run.sh workloads list          any other charllm-kit command (fabric, submit, ...)
#   ./run.sh --container [--platform P] [--container-runtime R] [--image I] [--dry-run] [...]
#                                    the same run inside the platform's image (docker/README.md);
#                                    --dry-run prints the exact container command
#
# Environment: CHARLLM_VENV (default .venv), CHARLLM_TORCH (the torch requirement used on a
# host without one; default torch==2.13.0, a CPU build on this project's machines),
# CHARLLM_NO_BROWSER=1 (`test`: do not apt-get install chromium for the report's browser test),
# CHARLLM_TEST_WORKERS (`test`: pytest-xdist workers, default 3; 0 runs the tests in one process),
# CHARLLM_TEST_CPU=FILE (`test`: record each test's wall and CPU time in FILE, a TSV).
set -euo pipefail
SETUP_START="${EPOCHREALTIME:-$(date +%s.%N)}"
cd "$(dirname "$0")"

VENV="${CHARLLM_VENV:-.venv}"
TORCH_REQ="${CHARLLM_TORCH:-torch==2.13.0}"
STAMP="$VENV/.charllm-installed"

pip_install() {
  # pip's index-location warnings on this project's machines are noise; errors still show.
  local status
  "$VENV/bin/python" -m pip install -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; } >&2
  status=${PIPESTATUS[0]}
  return "$status"
}

step() {
  # One line per setup step, with the time the previous one took: setup takes minutes.
  local now=$SECONDS
  if [[ -n "${STEP_START:-}" ]]; then
    echo "run.sh:   done in $((now - STEP_START)) s" >&2
  fi
  STEP_START=$now
  if [[ $# -gt 0 ]]; then
    echo "run.sh: setup $*" >&2
  fi
}

setup() {
  if [[ -f "$STAMP" && "$STAMP" -nt pyproject.toml ]]; then
    return
  fi
  echo "run.sh: setting up $VENV (first run only; a few minutes) ..." >&2
  if python3 -c "import torch" >/dev/null 2>&1; then
    # A GPU host or a container image: keep the torch it already has.
    step "1/4: creating $VENV with this host's torch"
    python3 -m venv --system-site-packages "$VENV"
    step "2/4: torch: keeping $(python3 -c 'import torch; print(torch.__version__)')"
  else
    step "1/4: creating $VENV"
    python3 -m venv "$VENV"
    step "2/4: installing $TORCH_REQ (the largest download)"
    pip_install "$TORCH_REQ"
  fi
  # The torch now present satisfies the kit's torch>=2.6, so nothing here pulls another one.
  # DeepSpeed (the `deepspeed` extra) builds its wheel from source: DS_BUILD_OPS=0 leaves its
  # C++ ops to just-in-time builds on first use, and --no-build-isolation builds it against
  # the torch installed here (an isolated build would fetch another torch to build with), which
  # needs setuptools in the environment.
  step "3/4: installing the kit with megatron-core and DeepSpeed (DeepSpeed builds from source)"
  pip_install "setuptools>=68"
  DS_BUILD_OPS=0 pip_install --no-build-isolation -e ".[test,deepspeed,chakra]"
  # MLCommons Chakra is not on the package index: its wheel and et_replay's are in the repo.
  # --no-deps: Chakra names HolisticTraceAnalysis by a git URL; the `chakra` extra above has
  # what they import (none of it is torch).
  step "4/4: installing MLCommons Chakra from third_party/wheels/"
  pip_install --no-deps third_party/wheels/*.whl "holistictraceanalysis==0.5.0"
  step
  touch "$STAMP"
  echo "run.sh: $VENV is ready" >&2
}

browser_for_tests() {
  # tests/test_report_layouts.py renders the HTML report in headless Chromium (Debian's
  # `chromium`): installed here when missing and this runs as root with apt, said before it
  # starts; CHARLLM_NO_BROWSER=1 leaves it out. Without it the test skips, saying why.
  if command -v chromium >/dev/null 2>&1; then
    return 0
  fi
  local skipped="the report's browser test (tests/test_report_layouts.py) will be skipped"
  if [[ -n "${CHARLLM_NO_BROWSER:-}" ]]; then
    echo "run.sh: chromium not installed (CHARLLM_NO_BROWSER is set): $skipped" >&2
    return 0
  fi
  if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "run.sh: chromium not found, and installing it needs root and apt-get: $skipped" >&2
    return 0
  fi
  echo "run.sh: the report's browser test needs chromium: installing it with apt-get (system" \
       "packages; CHARLLM_NO_BROWSER=1 skips this and that test) ..." >&2
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } >/dev/null 2>&1; then
    echo "run.sh: could not install chromium; the report's browser test will be skipped" >&2
  fi
}

setup
# Byte-compile the kit: an editable install is not compiled, and where PYTHONDONTWRITEBYTECODE is
# set (as in many images) Python never caches it, so every launcher, sampler and rank of every
# run would compile it anew (about 0.7 s of CPU a rank). Up to date, this only reads mtimes.
"$VENV/bin/python" -m compileall -q -j 0 kit >/dev/null 2>&1 || true
# The kit runs in this process (exec): tell it when the set-up began and ended, so its start-up
# clock starts at the end and the set-up is reported as its own phase (lifecycle's setup_s).
now="${EPOCHREALTIME:-$(date +%s.%N)}"
export CHARLLM_SETUP="$$ ${SETUP_START/,/.} ${now/,/.}"
KIT=("$VENV/bin/python" -m kit)

case "${1:-}" in
  --container)
    # `charllm-kit container run` takes the workload first, like `run`: the default when none.
    shift
    case "${1:-}" in
      ""|-*) set -- "${CHARLLM_WORKLOAD:-gpt3-tiny}" "$@" ;;
    esac
    exec "${KIT[@]}" container run "$@"
    ;;
  test)
    shift
    tier=()
    if [[ "${1:-}" == "--fast" ]]; then
      # The inner loop: the tests that carry none of the tier markers (pyproject.toml).
      shift
      tier=(-m "not training and not slurm and not image")
    fi
    browser_for_tests
    # pytest-xdist: three workers (CHARLLM_TEST_WORKERS; 0 runs the suite in this one process),
    # so tests that wait (grace periods, Slurm, sleeps) overlap ones that compute: on two cores a
    # third worker fills what two left idle (16.7 min idle against 17.3-18.2 with two, 2026-12-06,
    # benchmarks/reliability/results/suite-workers-2026-12-06.txt). --dist
    # loadfile: each file on one worker, so its module fixtures (images, runs, a Slurm cluster)
    # are made once; the session runs files share are made once for all workers
    # (tests/conftest.py). (--dist loadgroup cannot group with pytest 9: xdist 3.8 marks a group
    # in Node._nodeid, which pytest 9 no longer reads.) --durations: the slowest tests, named.
    exec "$VENV/bin/python" -m pytest -q --durations=15 -n "${CHARLLM_TEST_WORKERS:-3}" \
      --dist loadfile ${tier[@]+"${tier[@]}"} "$@"
    ;;
  -h|--help)
    # run.sh's own forms (the header above), then the CLI's help
    sed -n '2,11s/^# \{0,1\}//p' "$0"
    echo
    exec "${KIT[@]}" "$@"
    ;;
  --version)
    exec "${KIT[@]}" "$@"
    ;;
  ""|-*)
    # No workload named: the default small one for this host's platform.
    exec "${KIT[@]}" run "${CHARLLM_WORKLOAD:-gpt3-tiny}" "$@"
    ;;
  *)
    # A command by name, or a workload (the CLI takes `WORKLOAD ...` as `run WORKLOAD ...`):
    # the CLI decides, so every command it has passes through.
    exec "${KIT[@]}" "$@"
    ;;
esac
