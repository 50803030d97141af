"""Keep `import deepspeed` and DeepSpeed's ZeRO engines from importing what the launcher never uses.

Installed at `import launcher` (launcher/__init__.py), so every process that imports the launcher -- a rank, the
`launcher` command, `launcher calibrate`'s workers, the test drivers -- gets both, and nothing else changes: each
finder answers only the DeepSpeed module that asks, judged by the importing frame's module name, so our own code and
user code import the same names as usual, before or after DeepSpeed.

MLflow. DeepSpeed 0.19.8 imports its autotuner on every `import deepspeed` (runtime/config.py ->
deepspeed.autotuning), and the autotuner tries `import mlflow` to log autotuning experiments, which the launcher
never runs. With mlflow-skinny installed (our `mlflow` and `test` extras) that import pulls in FastAPI, the GenAI
judges and the tracking client: measured on the 2-core dev box while a test run shared it, `import deepspeed` took
1.5-2.1 s with the import refused and 2.8-4.8 s without (three alternating runs each; `python -X importtime -c
"import deepspeed"` shows mlflow as the largest subtree, ~1.3 s). The finder raises ModuleNotFoundError to the
autotuner, which then sets `has_mlflow = False`; our own MLflow logger (logging.mlflow.enabled,
launcher/runtime/metrics.py) imports it as usual.

Muon. DeepSpeed 0.19.8 imports its Muon modules inside every ZeRO path: `MuonWithAuxAdam` (zero/utils.py
is_zero_supported_optimizer, stage_1_and_2.py average_tensor, stage3.py __init__, bf16_optimizer.py, engine.py)
only to ask isinstance(optimizer, MuonWithAuxAdam), and `muon_update` (stage_1_and_2.py
_get_flat_partition_unpadded, every ZeRO-1/2 step) to call it on parameters tagged use_muon. Importing
original_muon applies torch.compile to its kernels, which loads inductor's compiler (torch._inductor.compile_fx and
its lowering tables): 1.55-1.67 s and +44 MiB resident per rank on the 2-core dev box (2026-11-28, measured after
importing torch, deepspeed and transformers' LLaMA), paid by every rank of every ZeRO run before its first step
(twice over for 4 ranks on 2 cores); bench/startup.py measures it on a whole run: 1.9 s of a 2-rank run. The
launcher's optimizer (the engine config's "AdamW", launcher/deepspeed_config.py; the only `optimizer.name`) is never
a MuonWithAuxAdam and tags no parameter use_muon, so when DeepSpeed's own code asks for those modules it gets
stand-ins that answer every one of its checks as the real modules would: a class nothing is an instance of, and a
muon_update that raises if it were ever reached. Where the real module is already loaded (someone imported it
first), Python's module cache answers before any finder and DeepSpeed gets the real one.
tests/unit/test_muon_stand_in.py holds the stand-ins to DeepSpeed's source (every name it imports from them).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types

_MLFLOW_REFUSED_TO = "deepspeed.autotuning.autotuner"
MUON_PACKAGE = "deepspeed.runtime.zero.muon"
MUON_MODULES = (f"{MUON_PACKAGE}.muon_optimizer", f"{MUON_PACKAGE}.original_muon")


def _is_import_machinery(module_name: str) -> bool:
    return module_name == "importlib" or module_name.startswith(("importlib.", "_frozen_importlib"))


def _importer() -> str:
    """The module name of the code whose import statement reached this finder: the first frame above the finder
    that is not importlib's own machinery (importlib.import_module included)."""
    frame = sys._getframe(2)
    while frame is not None and _is_import_machinery(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    return "" if frame is None else frame.f_globals.get("__name__", "")


class _NoMlflowForDeepSpeedAutotuner:
    """A sys.meta_path finder: ModuleNotFoundError for `mlflow` when deepspeed's autotuner asks, else no opinion."""

    def find_spec(self, name, path=None, target=None):
        if name == "mlflow" and _importer() == _MLFLOW_REFUSED_TO:
            raise ModuleNotFoundError("mlflow is not imported for DeepSpeed's autotuner (launcher/lean_imports.py)",
                                      name="mlflow")
        return None


class MuonWithAuxAdam:
    """Never instantiated: the stand-in DeepSpeed's ZeRO code checks optimizers against (launcher/lean_imports.py)."""


def muon_update(*args, **kwargs):
    raise RuntimeError("DeepSpeed's Muon update was reached, but the launcher gave DeepSpeed a stand-in for its "
                       "module (launcher/lean_imports.py): the launcher's optimizers never use Muon")


_STAND_INS = dict(zip(MUON_MODULES, ({"MuonWithAuxAdam": MuonWithAuxAdam}, {"muon_update": muon_update})))


class _MuonStandInsForDeepSpeed(importlib.abc.Loader):
    """A sys.meta_path finder and loader: the Muon stand-ins when DeepSpeed's code outside the Muon package asks."""

    def find_spec(self, name, path=None, target=None):
        importer = _importer() if name in _STAND_INS else ""
        if importer.startswith("deepspeed.") and not importer.startswith(MUON_PACKAGE):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return None   # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = "launcher stand-in (launcher/lean_imports.py): DeepSpeed's Muon optimizer is not used"
        module.__dict__.update(_STAND_INS[module.__name__])


def install() -> None:
    for kind in (_MuonStandInsForDeepSpeed, _NoMlflowForDeepSpeedAutotuner):
        if not any(isinstance(f, kind) for f in sys.meta_path):
            sys.meta_path.insert(0, kind())
