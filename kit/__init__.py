"""charllm-kit: a vendor-neutral kit that characterizes distributed LLM training.

Importing ``kit`` loads no training engine and no vendor library; those are imported lazily
where they are used, so ``charllm-kit --help`` works on any laptop.
"""

__version__ = "0.1.0"


def git_commit() -> str | None:
    """The kit checkout's HEAD commit, as bundles, projections and cache keys record it; None
    outside a git checkout (an installed wheel) or where git is missing."""
    import subprocess
    from pathlib import Path

    try:
        out = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=5, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
