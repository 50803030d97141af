"""Keep `import deepspeed` from importing MLflow, which it never uses in `launcher train`.

DeepSpeed 0.19.8 imports its autotuner on every `import deepspeed` (runtime/config.py -> deepspeed.autotuning),
and the autotuner tries `import mlflow` to log autotuning experiments, which the launcher never runs. With
mlflow-skinny installed (our `mlflow` and `test` extras) that import pulls in FastAPI, the GenAI judges and the
tracking client: measured on the 2-core dev box while a test run shared it, `import deepspeed` took 1.5-2.1 s with the import
refused and 2.8-4.8 s without (three alternating runs each; `python -X importtime -c "import deepspeed"` shows
mlflow as the largest subtree, ~1.3 s). Every rank imports DeepSpeed at start, so this is start-up time of every run.

The finder below refuses `mlflow` only to the autotuner module itself (the importing frame's module name), so the
autotuner sees `has_mlflow = False` and everything else -- our own MLflow logger (logging.mlflow.enabled,
launcher/runtime/metrics.py), user code -- imports MLflow as usual, before or after DeepSpeed.
"""

from __future__ import annotations

import sys

_REFUSED_TO = "deepspeed.autotuning.autotuner"


class _NoMlflowForDeepSpeedAutotuner:
    """A sys.meta_path finder: ModuleNotFoundError for `mlflow` when deepspeed's autotuner asks, else no opinion."""

    def find_spec(self, name, path=None, target=None):
        if name != "mlflow":
            return None
        frame = sys._getframe(1)
        for _ in range(12):   # importlib's own frames sit between the `import mlflow` statement and this finder
            if frame is None:
                break
            if frame.f_globals.get("__name__") == _REFUSED_TO:
                raise ModuleNotFoundError("mlflow is not imported for DeepSpeed's autotuner (launcher/lean_imports.py)",
                                          name="mlflow")
            frame = frame.f_back
        return None


def install() -> None:
    if not any(isinstance(f, _NoMlflowForDeepSpeedAutotuner) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoMlflowForDeepSpeedAutotuner())
