"""Diagnostic (not a test): how 4 CPU ranks on 2 cores share the cores over calibrate's 0.25 s copy window.

    LOCAL_WORLD_SIZE=4 .venv/bin/torchrun --nproc_per_node 4 bench/steptime/window_share.py

Three rounds of calibrate's own probes (its compute sweep, straggler and release probes, ZeRO-3 hooks), and after
each a 0.25 s window of 64 MiB copies on every rank at once, as calibrate._shared_copy_s times them; rank 0 prints,
per window, each rank's copy rate (GB/s), its CPU share (its thread's user + system time over the window's wall
time), its thread count, and /proc/stat's user+system / idle / steal jiffies over the window. 2026-12-06 (00:30 UTC,
bench/steptime/results.md): the shares summed to 1.97-2.08 cores, one rank got 0.14-0.84 of a core, and each rank's
rate followed its share (12.9-16.2 GB/s a CPU-second), so the slowest rank read 2.0-6.7 GB/s and the ranks' mean
6.7-7.5: calibrate._window_s takes the mean since.
"""
import os, time, resource, torch, torch.distributed as dist
from launcher.runtime import calibrate as C
dev = C._start_rank("cpu")
rank = dist.get_rank()
sync, agree = C._timer("cpu"), C._agreement(dist, dev)
dtypes = tuple((n, C._torch_dtype(n)) for n in ("fp32", "bf16"))
n = (64 << 20) // 4
psrc = torch.ones(n); pdst = torch.empty_like(psrc); pdst.copy_(psrc)
def stat():
    a = open("/proc/stat").readline().split()[1:]; return [int(x) for x in a]
def measure():
    dist.barrier()
    s0, r0, w0 = stat(), resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
    cnt = 0
    while time.perf_counter() - w0 < 0.25:
        pdst.copy_(psrc); cnt += 1
    w = time.perf_counter() - w0
    r1, s1 = resource.getrusage(resource.RUSAGE_THREAD), stat()
    d = [b - a for a, b in zip(s0, s1)]
    thr = int([l for l in open("/proc/self/status") if l.startswith("Threads")][0].split()[1])
    mine = torch.tensor([2*n*4*cnt/w/1e9, (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)/w, thr], dtype=torch.float64)
    allr = [torch.zeros(3, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(allr, mine)
    return {"gbps": [round(float(x[0]),2) for x in allr], "cpu_share": [round(float(x[1]),2) for x in allr],
            "threads": [int(x[2]) for x in allr], "stat_user_sys_idle_steal": [d[0]+d[1], d[2], d[3], d[7]]}
unit = C._segment_unit(dev, "cpu", sync, dist)
local = int(os.environ["LOCAL_WORLD_SIZE"])
rows = []
for k in range(3):
    C._compute_sweep(dev, "cpu", dtypes, sync, dist)
    rows.append(("sweep", k, measure()))
    C._straggler(dev, "cpu", sync, dist, unit)
    C._release(dev, "cpu", sync, dist, [*C._sub_node_sizes(local), local], unit)
    C._straggler(dev, "cpu", sync, dist, unit, active=C.compute_slots())
    rows.append(("after-waits", k, measure()))
    C._zero3_hooks(dev, sync, agree, 1.0)
    rows.append(("after-zero3", k, measure()))
    time.sleep(1)
    rows.append(("after-sleep", k, measure()))
if rank == 0:
    for r in rows: print(r, flush=True)
dist.barrier()
