"""What a minor page fault costs on this machine (diagnostic for bench/steptime; not a test).

    .venv/bin/python bench/steptime/pagefault.py

Fills a fresh 64 MiB tensor twice: the first fill faults in every page (the kernel maps and zero-fills it), the
second only writes. The difference over the pages is the cost of one fault, what a CPU rank pays for every page of
a buffer the allocator took fresh from the kernel (launcher/runtime/cpualloc.py).
"""
import resource
import statistics
import time

import torch

PAGE = resource.getpagesize()


def once(nbytes: int = 64 << 20) -> tuple[float, int]:
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    x = torch.empty(nbytes // 4)
    x.fill_(0.0)
    first = time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    t0 = time.perf_counter()
    x.fill_(1.0)
    second = time.perf_counter() - t0
    del x
    return (first - second) / max(1, faults), faults


if __name__ == "__main__":
    torch.set_num_threads(1)
    runs = [once() for _ in range(7)]
    costs = [c for c, _ in runs]
    print(f"{runs[0][1]} faults per 64 MiB fill ({(64 << 20) // PAGE} pages of {PAGE} B); "
          f"cost per fault {statistics.median(costs) * 1e6:.2f} us median, "
          f"{min(costs) * 1e6:.2f}-{max(costs) * 1e6:.2f} over 7")
