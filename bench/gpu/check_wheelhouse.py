"""Prove a wheelhouse closed for a bare GPU image: every wheel installs on CPython 3.12 / manylinux x86_64,
and every requirement of every wheel (markers evaluated for that interpreter, no extras) is met by another
wheel in the set or by what the image already has (IMAGE_PROVIDES: PyTorch's and transformers' own
requirements). Exit 1 with the unmet requirements listed.

    python bench/gpu/check_wheelhouse.py bench/gpu/wheelhouse
"""

from __future__ import annotations

import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

# torch (and its nvidia-* / triton wheels) and transformers with their install requirements (the wheelhouse
# carries a newer transformers itself, whose requirements the image meets).
IMAGE_PROVIDES = {canonicalize_name(n) for n in (
    "torch", "triton", "transformers", "numpy", "packaging", "pyyaml", "requests", "tqdm", "filelock", "huggingface-hub",
    "safetensors", "tokenizers", "regex", "fsspec", "jinja2", "markupsafe", "sympy", "mpmath", "networkx",
    "typing-extensions", "setuptools", "urllib3", "idna", "certifi", "charset-normalizer", "hf-xet",
    # transformers 5's CLI (typer) and its requirements: in the device image's package list (KINDS.md, 2026-11-17)
    "typer", "click", "shellingham")}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"]
TAGS = set(cpython_tags((3, 12), abis=["cp312", "abi3", "none"], platforms=PLATFORMS)) | set(
    compatible_tags((3, 12), "cp312", platforms=PLATFORMS))
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}


def main(wheelhouse: str) -> int:
    wheels = sorted(Path(wheelhouse).glob("*.whl"))
    have = {}
    problems = []
    for w in wheels:
        name, version, _, tags = parse_wheel_filename(w.name)
        have[name] = version
        if not tags & TAGS:
            problems.append(f"{w.name}: no tag installs on CPython 3.12 manylinux x86_64")
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            msg = Parser().parsestr(z.read(meta).decode())
        for line in msg.get_all("Requires-Dist") or []:
            req = Requirement(line)
            if req.marker and not req.marker.evaluate(ENV):
                continue
            n = canonicalize_name(req.name)
            if n in have:
                if req.specifier and not req.specifier.contains(have[n], prereleases=True):
                    problems.append(f"{w.name} needs {req}, the wheelhouse has {n} {have[n]}")
            elif n not in IMAGE_PROVIDES:
                problems.append(f"{w.name} needs {req}: not in the wheelhouse, not in the image")
    size = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB; " + ("closed" if not problems else f"{len(problems)} unmet:"))
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
