"""A rank's crash stacks (launcher/runtime/launch.py record_crash_stacks, innermost_frame): a real segfault in a child
process, not a signal sent to it, leaves a faulthandler dump whose crashing frame the launcher names. The whole
path, a rank killed by SIGSEGV under `launcher train`, is tests/train/test_failures.py's."""

import signal
import subprocess
import sys
import textwrap

from launcher.runtime.launch import STACK_SUFFIX, innermost_frame


def test_a_real_segfault_is_named_by_its_innermost_frame(tmp_path):
    pkg = tmp_path / "checkout" / "launcher"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "crash.py").write_text(textwrap.dedent("""\
        import ctypes
        import threading
        import time


        def idle():
            time.sleep(60)


        def read_address_zero():
            threading.Thread(target=idle, daemon=True).start()
            return ctypes.string_at(0)  # dereferences NULL: SIGSEGV inside C
        """))
    record = tmp_path / "rank-00003.json"
    record.write_text("{}")
    # The child loads this checkout's launch.py, then the stand-in crash.py by its path (both packages are `launcher`).
    child = ("import sys, importlib.util; from pathlib import Path; from launcher.runtime.launch import record_crash_stacks;"
             "record_crash_stacks(Path(sys.argv[2]));"
             "spec = importlib.util.spec_from_file_location('crash', sys.argv[1] + '/launcher/crash.py');"
             "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.read_address_zero()")
    res = subprocess.run([sys.executable, "-c", child, str(tmp_path / "checkout"), str(record)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == -signal.SIGSEGV, (res.returncode, res.stderr[-2000:])
    dump = record.with_suffix(STACK_SUFFIX).read_text()
    assert dump.startswith("Fatal Python error: Segmentation fault"), dump
    assert "Thread 0x" in dump and "in idle" in dump, dump  # every thread, not only the crashing one
    # innermost first: the standard library's string_at, named from below pythonX.Y/
    assert innermost_frame(dump).startswith("ctypes/__init__.py:") and innermost_frame(dump).endswith(" in string_at")
    # the frame under it, in a file of a `launcher` package outside site-packages: named from the package down
    innermost = dump[dump.index("Current thread "):].splitlines()[1]
    below = dump.replace(innermost + "\n", "", 1)
    assert innermost_frame(below) == "launcher/crash.py:12 in read_address_zero", below


def test_no_dump_no_frame():
    assert innermost_frame("") is None
    assert innermost_frame("Fatal Python error: Segmentation fault\n\n<no Python frame>\n") is None
