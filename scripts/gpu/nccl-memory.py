#!/usr/bin/env python3
"""Measures, on a machine of two or more GPUs, the memory NCCL takes on each GPU outside PyTorch's
caching allocator: one process per rank (started here, one per GPU), each reading at every stage
what its GPU holds (NVML, which makes no CUDA context) less what its allocator reserved. Stages:
CUDA started (`torch.zeros(1)`), the process group made with its communicator (`init_process_group(
"nccl", device_id=...)`), then after the first all-reduce of one element, an all-gather, a
reduce-scatter and an all-reduce of 256 MiB, each rank waiting for the others before it reads.

    python3 scripts/gpu/nccl-memory.py OUT.json [WORLD_SIZE ...]

Each world size (default: 2 up to the GPUs there) is a fresh set of processes. NVLink multicast
stays off (NCCL_NVLS_ENABLE=0, as the machine sets it). Writes OUT.json only if it does not exist.
Standard library, PyTorch and nvidia-ml-py only.
"""
import json
import os
import sys
from pathlib import Path

def used_on(index):
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    return pynvml.nvmlDeviceGetMemoryInfo(h).used


def rank_main(rank, world, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                      TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    import torch
    import torch.distributed as dist
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    before = used_on(rank)
    rows = []

    def read(stage):
        torch.cuda.synchronize()
        if dist.is_initialized():
            dist.barrier(device_ids=[rank])
            torch.cuda.synchronize()
        used = used_on(rank)
        reserved = torch.cuda.memory_reserved(device)
        rows.append(dict(stage=stage, device_used=used, used_by_process=used - before,
                         reserved=reserved, outside_allocator=used - before - reserved))

    torch.zeros(1, device=device)
    read("cuda")
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    read("process_group")
    x = torch.ones(1, device=device)
    dist.all_reduce(x)
    read("all_reduce_1")
    n = (64 << 20) // 2
    shard = torch.ones(n // world, device=device, dtype=torch.bfloat16)
    full = torch.empty(n // world * world, device=device, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(full, shard)
    read("all_gather_64mib")
    dist.reduce_scatter_tensor(shard, full)
    read("reduce_scatter_64mib")
    del full, shard
    big = torch.ones((256 << 20) // 4, device=device)
    dist.all_reduce(big)
    read("all_reduce_256mib")
    queue.put(dict(rank=rank, used_before_cuda=before, stages=rows,
                   nccl=".".join(map(str, torch.cuda.nccl.version())),
                   gpu=torch.cuda.get_device_name(device)))
    dist.destroy_process_group()


def main():
    out = Path(sys.argv[1])
    if out.exists():
        raise SystemExit(f"{out} exists: not overwritten")
    import torch
    import torch.multiprocessing as mp
    gpus = torch.cuda.device_count()
    worlds = [int(w) for w in sys.argv[2:]] or list(range(2, gpus + 1))
    ctx = mp.get_context("spawn")
    runs = []
    for i, world in enumerate(worlds):
        queue = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, world, 29500 + i, queue)) for r in range(world)]
        for p in procs:
            p.start()
        ranks = sorted((queue.get(timeout=300) for _ in procs), key=lambda r: r["rank"])
        for p in procs:
            p.join()
        runs.append(dict(world_size=world, ranks=ranks))
        for r in ranks:
            print(f"world {world} rank {r['rank']}: outside the allocator "
                  + ", ".join(f"{s['stage']} {s['outside_allocator']}" for s in r["stages"]), flush=True)
    import platform
    record = dict(schema="iteragpu-lab/nccl-memory/1", torch=torch.__version__, gpus=gpus,
                  gpu=torch.cuda.get_device_name(0), python=platform.python_version(), runs=runs,
                  env={k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "NCCL_BUFFSIZE", "NCCL_P2P_DISABLE")})
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.rename(out)


if __name__ == "__main__":
    main()
