"""The stand-ins for DeepSpeed's Muon modules (launcher/lean_imports.py, installed at `import launcher`).

Held to DeepSpeed's own source, read as text (importing the real modules is what the stand-ins avoid): every name
DeepSpeed imports from those two modules outside them is one the stand-ins define, and the real modules define it
too. A DeepSpeed upgrade that imports another name, or renames one, fails here instead of in a rank. In a fresh
interpreter that imported the launcher, a ZeRO-1 engine on one CPU rank builds, steps, gets the stand-ins (nothing is
a MuonWithAuxAdam, muon_update refuses to run) and never loads torch._inductor.compile_fx (the 1.6 s the stand-ins
save; torch._dynamo loads the torch._inductor package itself, without its compiler); code that is not DeepSpeed's
importing the same module gets the real one.
"""

import ast
import socket
import subprocess
import sys
from pathlib import Path

import deepspeed

from launcher.lean_imports import MUON_MODULES

DS = Path(deepspeed.__file__).parent
REPO = Path(__file__).resolve().parents[2]


def _imported_names(module: str) -> set:
    """Every `from <module> import name` in DeepSpeed's sources outside the module's own package."""
    names = set()
    own = DS / "runtime" / "zero" / "muon"
    for path in DS.rglob("*.py"):
        if own in path.parents:
            continue
        text = path.read_text(errors="replace")
        if module not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                assert all(a.name != module for a in node.names), (path, "imports the module itself")
    return names


def _defined_names(module: str) -> set:
    tree = ast.parse((DS / Path(*module.split(".")[1:])).with_suffix(".py").read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}


def test_stand_ins_cover_every_name_deepspeed_imports_from_them():
    optimizer_module, update_module = MUON_MODULES
    assert _imported_names(optimizer_module) == {"MuonWithAuxAdam"}
    assert _imported_names(update_module) == {"muon_update"}
    assert "MuonWithAuxAdam" in _defined_names(optimizer_module)
    assert "muon_update" in _defined_names(update_module)


CHILD = """
import sys, os
import torch
import launcher  # noqa: F401 -- installs the stand-ins' finder (launcher/lean_imports.py)
from launcher.runtime.distributed import avoid_shm_comm_build
avoid_shm_comm_build("cpu")
import deepspeed
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
    "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "torch_adam": True}},
    "zero_optimization": {"stage": 1}})
before = [p.detach().clone() for p in model.parameters()]
loss = engine(torch.randn(2, 8)).pow(2).mean()
engine.backward(loss)
engine.step()
assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters())), "the step moved nothing"
print("inductor loaded:", "torch._inductor.compile_fx" in sys.modules)
# What DeepSpeed imported during the engine's build and step: the stand-ins, answering as the launcher needs.
optimizer_module = sys.modules["deepspeed.runtime.zero.muon.muon_optimizer"]
update_module = sys.modules["deepspeed.runtime.zero.muon.original_muon"]
print("stand-ins:", "stand-in" in (optimizer_module.__doc__ or ""), "stand-in" in (update_module.__doc__ or ""))
assert not isinstance(opt.optimizer, optimizer_module.MuonWithAuxAdam)
try:
    update_module.muon_update(None, None)
    raise SystemExit("muon_update ran")
except RuntimeError as e:
    assert "stand-in" in str(e)
from launcher.runtime.distributed import leave_rank
leave_rank(0)   # as every rank ends: gloo's threads have aborted finished processes at interpreter exit
"""

USER_CHILD = """
import sys
import launcher  # noqa: F401
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
from deepspeed.runtime.zero.muon.original_muon import muon_update
module = sys.modules[MuonWithAuxAdam.__module__]
print("real:", "stand-in" not in (module.__doc__ or ""), MuonWithAuxAdam.__module__, muon_update.__module__,
      "BaseMuonWithAuxAdam" in vars(module))
"""


def _free_port() -> str:
    # A fixed port collides with another test's group still in TIME_WAIT, or one running beside this.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _child(code, tmp_path):
    return subprocess.run([sys.executable, "-c", code, _free_port()], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                               "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "HOME": str(tmp_path)})


def test_a_zero_engine_steps_on_the_stand_ins_without_loading_inductor(tmp_path):
    proc = _child(CHILD, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "inductor loaded: False" in proc.stdout, proc.stdout[-2000:]
    assert "stand-ins: True True" in proc.stdout, proc.stdout[-2000:]
    assert not any((tmp_path / "ext").glob("*")), "something was JIT-built"


def test_code_that_is_not_deepspeeds_gets_the_real_modules(tmp_path):
    proc = _child(USER_CHILD, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert ("real: True deepspeed.runtime.zero.muon.muon_optimizer deepspeed.runtime.zero.muon.original_muon True"
            in proc.stdout), proc.stdout[-2000:]
