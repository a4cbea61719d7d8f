#!/usr/bin/env python3
"""What PyTorch's CUDA kernels allocate besides their outputs, from the allocator's trace (every
allocation's bytes, and every free, in order), where the budget's replay follows a library's own
decision rather than a shape:

    python3 scripts/gpu/kernel-allocations.py reductions OUT.json [--header DIR]
    python3 scripts/gpu/kernel-allocations.py attention OUT.json
    python3 scripts/gpu/kernel-allocations.py tied OUT.json

- reductions: a sum over the leading dimensions of a `[b, t, h]` tensor (as autograd's `sum_to`
  reduces a broadcast operand's gradient) and over the whole tensor, float32 and bfloat16: the
  partial sums and semaphores `setReduceConfig` stages (`tests/fixtures/reduce-staging-h200.json`);
  `--header DIR` copies the installed `ATen/native/cuda/Reduce.cuh` there.
- attention: PyTorch's default scaled dot-product attention, forward and backward, for head
  widths 64 to 256, grouped and whole keys and values, causal and with a boolean mask, and the
  backend picked (`tests/fixtures/attention-workspace-h200.json`).
- tied: the backward pass of `F.linear(embedding(ids) [* scale], weight)` with one weight for both,
  per dtype and number of tokens, and which allocation ends as the weight's `.grad`.
"""
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = [
    (1, 1536, 2560), (1, 2048, 4096), (4, 1024, 4096), (2, 1024, 2304), (4, 2048, 3584), (1, 8192, 4096),
    (8, 1024, 2048), (3, 40, 320), (2, 56, 384), (1, 4096, 3840), (2, 2048, 2560), (1, 512, 896),
    (6, 1000, 896), (3, 1500, 3072), (1, 1024, 7168), (16, 2048, 4096), (1, 100, 128256), (7, 333, 1000),
]

# (batch, heads, kv heads, length, head width)
CASES = [
    (1, 8, 4, 1536, 256), (2, 8, 4, 1024, 256), (1, 16, 8, 2048, 256), (1, 8, 8, 1024, 256),
    (1, 32, 8, 2048, 128), (2, 28, 4, 1024, 128), (1, 32, 32, 1024, 96), (2, 32, 8, 1024, 64),
    (1, 16, 4, 1000, 192), (1, 8, 4, 777, 160), (1, 8, 2, 1024, 80), (3, 14, 2, 500, 64),
    (1, 8, 4, 1024, 224), (1, 4, 1, 2048, 256),
]


def traced(fn):
    """`fn()` and the allocator's events meanwhile: [action, address, bytes]."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000, context=None, stacks="all")
    out = fn()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [[e["action"], e["addr"], e["size"]] for e in snap["device_traces"][0]
              if e["action"] in ("alloc", "free_completed")]
    return out, events


def sizes(events):
    return [e[2] for e in events if e[0] == "alloc"]


def reductions(args):
    if "--header" in args:
        folder = Path(args[args.index("--header") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        header = Path(torch.__file__).parent / "include/ATen/native/cuda/Reduce.cuh"
        if header.exists():
            shutil.copy(header, folder / "Reduce.cuh")
    rows = []
    for shape in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape, device="cuda", dtype=dtype)
            lead = tuple(range(len(shape) - 1))
            _, leading = traced(lambda: x.sum(lead))
            _, whole = traced(lambda: x.sum())
            rows.append(dict(shape=list(shape), dtype=str(dtype), sum_leading=sizes(leading),
                             sum_all=sizes(whole)))
            del x
    props = torch.cuda.get_device_properties(0)
    return dict(gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__, rows=rows)


def attention(args):
    rows = []
    for b, h, kv, s, d in CASES:
        for masked in (False, True):
            q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            mask = torch.ones(s, s, device="cuda", dtype=torch.bool).tril() if masked else None
            out, fwd = traced(lambda: F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=not masked, enable_gqa=kv != h))
            grad = torch.ones_like(out)
            _, bwd = traced(lambda: out.backward(grad))
            rows.append(dict(batch=b, heads=h, kv_heads=kv, length=s, head_dim=d, masked=masked,
                             grad_fn=type(out.grad_fn).__name__,
                             forward=[[e[0], e[2]] for e in fwd], backward=[[e[0], e[2]] for e in bwd]))
            del q, k, v, out, grad, mask
    props = torch.cuda.get_device_properties(0)
    return dict(gpu=props.name, torch=torch.__version__, cudnn=torch.backends.cudnn.version(), rows=rows)


def tied(args):
    vocab, width = 4096, 512
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for tokens in (1536, 4096):
            for scaled in (False, True):
                w = torch.nn.Parameter(torch.randn(vocab, width, device="cuda", dtype=dtype))
                ids = torch.randint(0, vocab, (1, tokens), device="cuda")
                h = F.embedding(ids, w)
                if scaled:
                    h = h * torch.tensor(2.0, device="cuda", dtype=dtype)
                loss = F.linear(h, w).float().sum()
                _, events = traced(lambda: loss.backward())
                full = [e for e in events if e[0] == "alloc" and e[2] == vocab * width * w.element_size()]
                rows.append(dict(dtype=str(dtype), tokens=tokens, scaled=scaled,
                                 weight_sized_allocations=len(full),
                                 grad_is_allocation=[i for i, e in enumerate(full) if e[1] == w.grad.data_ptr()],
                                 events=events))
    return dict(torch=torch.__version__, rows=rows)


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("reductions", "attention", "tied"):
        sys.exit(__doc__)
    what, out = sys.argv[1], Path(sys.argv[2])
    result = {"reductions": reductions, "attention": attention, "tied": tied}[what](sys.argv[3:])
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
