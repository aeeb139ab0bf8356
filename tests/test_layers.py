"""kit/ keeps its layers: import-linter's contracts in pyproject.toml hold, and would catch a
package that imports one above it (docs/architecture.md lists the layers)."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the kit in ``root`` with ``root``'s pyproject.toml."""
    return subprocess.run([str(LINT_IMPORTS), "--no-logo", "--no-cache", "pyproject.toml"],
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)


def test_the_kit_keeps_its_layers_and_imports_no_framework_above_the_ranks():
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def test_a_format_module_importing_the_launcher_breaks_the_layers(tmp_path):
    shutil.copytree(REPO / "kit", tmp_path / "kit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    schema = tmp_path / "kit" / "bundle" / "schema.py"
    schema.write_text(schema.read_text() + "\n\ndef _late():\n    import kit.launch.session\n")
    done = _lint(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "kit.bundle.schema -> kit.launch.session" in done.stdout
    assert "1 kept, 1 broken" in done.stdout
