"""`import launcher` keeps DeepSpeed's autotuner from importing MLflow, and only it (launcher/lean_imports.py)."""

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # DeepSpeed logs its accelerator choice to stdout too: keep only the lines this code printed.
    return [w for line in out.stdout.splitlines() if line.startswith("=") for w in line[1:].split()]


def test_deepspeed_imports_without_mlflow_and_mlflow_still_imports():
    pytest.importorskip("mlflow")
    # Real imports in a fresh interpreter: DeepSpeed's own flag says it found no MLflow, MLflow was not loaded by it,
    # and our logger's later `import mlflow` (launcher/runtime/metrics.py) still gets the real package.
    has, loaded, ours = _run(
        "import sys, launcher, deepspeed\n"
        "import deepspeed.autotuning.autotuner as a\n"
        "print('=', a.has_mlflow, 'mlflow' in sys.modules)\n"
        "import mlflow\n"
        "print('=', hasattr(mlflow, 'log_metric'))\n")
    assert (has, loaded, ours) == ("False", "False", "True")


def test_without_launcher_deepspeed_would_import_mlflow():
    # The guard is what changes it: the same import without `import launcher` loads MLflow (so the test above
    # fails if DeepSpeed stops importing it and this file becomes moot).
    pytest.importorskip("mlflow")
    has, loaded = _run("import sys, deepspeed\nimport deepspeed.autotuning.autotuner as a\n"
                       "print('=', a.has_mlflow, 'mlflow' in sys.modules)\n")
    assert (has, loaded) == ("True", "True")
