#!/usr/bin/env python3
"""One Hugging Face workload, measured stage by stage in this fresh process: what users run
(transformers' `generate` with its default cache, `torch.optim.AdamW` as PyTorch ships it, PEFT
LoRA, gradient checkpointing, autocast), on a model with random weights built from a config.

    python3 scripts/gpu/hf-run.py SPEC.json RESULT.json

SPEC (JSON): model_type, config (the config.json fields), loading (from_config: built on the GPU;
pretrained: `from_pretrained(device_map=...)` of a sparse checkpoint of zeros written first, as
users load a model), dtype (float16|bfloat16|float32),
autocast (null|bfloat16|float16: float32 weights trained under autocast), mode
(inference|full|lora|qlora), batch, context, generated, checkpointing, optimizer
(adamw|adamw-8bit), optimizer_impl (foreach|fused|for-loop), lora {rank, alpha, targets},
steps, python_hash_seed (PYTHONHASHSEED of the run's process; the caller sets it), card_bytes (null, or emulate a card of that many bytes: the memory beyond it is taken
with one cudaMalloc outside PyTorch's allocator once CUDA has started), trace (none|sizes|stacks:
the allocator's own trace, `torch.cuda.memory._record_memory_history`).
PYTORCH_CUDA_ALLOC_CONF is read from the environment (the caller sets it).

RESULT (JSON): the spec, the environment, the order this process iterates the set of the
configuration's layer kinds (`mask_order`, when it has `layer_types`), per stage (stage, allocated_before, allocated_after,
reserved_after, peak_allocated, peak_reserved, device_used_after = total - free,
outside_after = device_used_after - reserved_after, host_ms), the outcome (ok; oom with the
stage and the message; or error with the stage it failed in, the message and the traceback: a
library that fails on a full card, such as cuDNN's attention, says so in its own words), the
allocator's counters at the end and, with a trace, every event
(action, address, size, stream; with stacks, a Python stack id per allocation and the stacks).
Writes RESULT even when the workload runs out of memory; exits 0 unless the script itself
failed.
"""
import json
import os
import sys
import time
import traceback

PREQUANTIZE = sys.argv[1] == "--prequantize"
if PREQUANTIZE:
    sys.argv.pop(1)
SPEC = json.loads(open(sys.argv[1]).read())
RESULT_PATH = sys.argv[2]
# IGL_DRY_RUN=1: the same code on the CPU, no figure read (scripts checked before a device call).
DRY = os.environ.get("IGL_DRY_RUN") == "1"
DEVICE = "cpu" if DRY else "cuda"

import torch  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
KEEP_FRAMES = ("transformers/", "peft/", "bitsandbytes/", "torch/optim/", "torch/utils/checkpoint",
               "torch/nn/functional", "torch/autograd", "torch/amp", "torch/distributed", "torch/nn/parallel",
               "torch/nn/utils", "trl/", "accelerate/", "hf-run.py", "hf_loops.py")


class Stages:
    """Per-stage figures: each stage synchronises, reads `allocated`, resets the peaks, runs,
    synchronises and reads the ends and the peaks; with a trace, a snapshot marks its ends."""

    def __init__(self, tracing):
        self.rows = []
        self.tracing = tracing
        self.markers = []
        self.current = None

    def begin(self, name):
        if DRY:
            self.current = (name, 0, time.perf_counter())
            return
        torch.cuda.synchronize()
        self.current = (name, torch.cuda.memory_allocated(), time.perf_counter())
        torch.cuda.reset_peak_memory_stats()
        if self.tracing:
            self.markers.append((name, "begin", trace_length()))

    def end(self):
        if DRY:
            self.rows.append(dict(stage=self.current[0]))
            self.current = None
            return
        torch.cuda.synchronize()
        name, before, t0 = self.current
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        self.rows.append(dict(
            stage=name, allocated_before=before, allocated_after=torch.cuda.memory_allocated(),
            reserved_after=reserved, peak_allocated=torch.cuda.max_memory_allocated(),
            peak_reserved=torch.cuda.max_memory_reserved(), device_used_after=total - free,
            outside_after=total - free - reserved, host_ms=round((time.perf_counter() - t0) * 1000, 3)))
        if self.tracing:
            self.markers.append((name, "end", trace_length()))
        self.current = None


def trace_length():
    return len(torch.cuda.memory._snapshot()["device_traces"][0])


def environment():
    import transformers
    env = dict(torch=torch.__version__, cuda=torch.version.cuda, transformers=transformers.__version__,
               gpu=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
               alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    try:
        import peft
        env["peft"] = peft.__version__
    except ImportError:
        pass
    try:
        import bitsandbytes
        env["bitsandbytes"] = bitsandbytes.__version__
    except ImportError:
        pass
    try:
        import subprocess
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001 - the driver is informative only
        env["driver"] = None
    return env


def build_config():
    from transformers import AutoConfig
    cfg = AutoConfig.for_model(SPEC["model_type"], **SPEC["config"])
    return cfg


def build_model(cfg, dtype):
    from transformers import AutoModelForCausalLM
    if SPEC.get("loading") == "prequantized":
        return build_prequantized(dtype)
    if SPEC["mode"] == "qlora":
        return build_quantized(cfg)
    if SPEC.get("loading", "from_config") == "pretrained":
        return build_pretrained(cfg, dtype)
    with torch.device(DEVICE):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=SPEC.get("attn_implementation", "sdpa"))


SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def write_sparse_checkpoint(cfg, dtype, folder):
    """A checkpoint of zeros as `save_pretrained` lays it out (config.json, model.safetensors),
    written sparse: the header, then a hole as long as the tensors (no data written)."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    state = meta.state_dict()
    params = dict(meta.named_parameters())
    names = list(params) + [k for k, _ in meta.named_buffers() if k in state]
    header, offset = {}, 0
    for name in sorted(names):
        t = params.get(name, state.get(name))
        size = t.numel() * t.element_size()
        header[name] = dict(dtype=SAFETENSORS_DTYPES[t.dtype], shape=list(t.shape),
                            data_offsets=[offset, offset + size])
        offset += size
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    cfg.save_pretrained(folder)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        f.truncate(8 + len(text) + offset)


def build_pretrained(cfg, dtype):
    """What users run: `from_pretrained` of a checkpoint on disk onto the GPU (transformers'
    allocator warm-up, then each tensor)."""
    import tempfile
    from transformers import AutoModelForCausalLM
    folder = tempfile.mkdtemp(prefix="igl-checkpoint-")
    write_sparse_checkpoint(cfg, dtype, folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map={"": DEVICE if DRY else 0},
                                                attn_implementation=SPEC.get("attn_implementation", "sdpa"))


def build_quantized(cfg):
    """QLoRA as users load it: a checkpoint on disk loaded in NF4 with double quantization."""
    import tempfile
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    compute = DTYPES[SPEC["dtype"]]
    folder = tempfile.mkdtemp(prefix="igl-qlora-")
    with torch.device("cpu"):
        AutoModelForCausalLM.from_config(cfg, dtype=compute).save_pretrained(folder)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=compute)
    return AutoModelForCausalLM.from_pretrained(folder, quantization_config=quant, dtype=compute,
                                                device_map={"": 0}, attn_implementation=SPEC.get("attn_implementation", "sdpa"))


def quantization_config():
    """The `quantization` of the spec as transformers' configuration: {"method": "bnb4" (NF4,
    double quantization), "bnb8", "fp8" (fine-grained, blocks of 128 × 128), ...its arguments}."""
    from transformers import BitsAndBytesConfig, FineGrainedFP8Config
    q = dict(SPEC["quantization"])
    method = q.pop("method")
    compute = DTYPES[SPEC["dtype"]]
    if method == "bnb4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=q.pop("quant_type", "nf4"),
                                  bnb_4bit_use_double_quant=q.pop("double_quant", True),
                                  bnb_4bit_compute_dtype=compute, **q)
    if method == "bnb8":
        return BitsAndBytesConfig(load_in_8bit=True, **q)
    if method == "fp8":
        return FineGrainedFP8Config(**q)
    raise SystemExit(f"unknown quantization method {method}")


def prequantize(folder):
    """Writes a checkpoint as its publisher ships it pre-quantized: a checkpoint of zeros (written
    sparse: the values change no size the allocator sees, and an 8B model's random weights took
    minutes to make and write) loaded quantized onto the GPU, saved again (the quantized tensors
    and the config's `quantization_config`), into `folder`; run in a process of its own."""
    import tempfile
    from transformers import AutoModelForCausalLM
    cfg = build_config()
    dtype = DTYPES[SPEC["dtype"]]
    plain = tempfile.mkdtemp(prefix="igl-plain-")
    write_sparse_checkpoint(cfg, dtype, plain)
    model = AutoModelForCausalLM.from_pretrained(plain, quantization_config=quantization_config(), dtype=dtype,
                                                 device_map={"": 0})
    model.save_pretrained(folder)


def build_prequantized(dtype):
    """A pre-quantized checkpoint loaded as users load one: `from_pretrained` with a device map
    (the quantization comes from the checkpoint's config). The checkpoint is written first by a
    process of its own (`--prequantize`), so that nothing of that step is measured here."""
    import subprocess
    import tempfile
    from transformers import AutoModelForCausalLM
    folder = tempfile.mkdtemp(prefix="igl-prequantized-")
    subprocess.run([sys.executable, __file__, "--prequantize", sys.argv[1], folder], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=""))
    with open(os.path.join(folder, "config.json")) as f:
        RECORD_EXTRA["quantization_config"] = json.load(f).get("quantization_config")
    RECORD_EXTRA["checkpoint_tensors"] = checkpoint_tensors(folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map={"": 0},
                                                attn_implementation=SPEC.get("attn_implementation", "sdpa"))


RECORD_EXTRA = {}


def checkpoint_tensors(folder):
    """Every tensor of a safetensors checkpoint's headers: name, dtype, shape."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with open(os.path.join(folder, name), "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            header.pop("__metadata__", None)
            out.update({k: [v["dtype"], v["shape"]] for k, v in header.items()})
    return out


def emulate_card():
    """Takes the memory beyond `card_bytes` with one cudaMalloc outside PyTorch's allocator."""
    card = SPEC.get("card_bytes")
    if not card:
        return None
    import ctypes
    free, total = torch.cuda.mem_get_info()
    take = free - (card - (total - free))
    if take <= 0:
        raise SystemExit(f"the card of {card} bytes is larger than what this GPU has free")
    # The CUDA runtime libtorch already loaded (same handle): its cudaMalloc, outside the allocator.
    cudart = ctypes.CDLL("libcudart.so.13")
    pointer = ctypes.c_void_p()
    status = cudart.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(take))
    if status != 0:
        raise SystemExit(f"cudaMalloc of {take} bytes failed ({status})")
    free_after, _ = torch.cuda.mem_get_info()
    return dict(card_bytes=card, taken_bytes=take, total_bytes=total, free_after_bytes=free_after)


def optimizer_for(params):
    impl = SPEC.get("optimizer_impl", "foreach")
    if SPEC.get("optimizer", "adamw") == "adamw-8bit":
        import bitsandbytes as bnb
        return bnb.optim.AdamW8bit(params, lr=1e-5)
    kwargs = {"foreach": None, "fused": None}
    if impl == "fused":
        kwargs = {"fused": True}
    elif impl == "for-loop":
        kwargs = {"foreach": False}
    # impl == "foreach": left unset, PyTorch's default on CUDA.
    return torch.optim.AdamW(params, lr=1e-5, **kwargs)


def apply_lora(model):
    from peft import LoraConfig, get_peft_model
    lora = SPEC["lora"]
    config = LoraConfig(r=lora["rank"], lora_alpha=lora.get("alpha", 2 * lora["rank"]), lora_dropout=lora.get("dropout", 0.0),
                        target_modules=lora["targets"], task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def run(stages, record):
    import hf_loops
    loop = hf_loops.loop_of(SPEC)
    if loop is not None:
        return loop(SPEC, stages, record, sys.modules[__name__])
    dtype = DTYPES["float32" if SPEC.get("autocast") else SPEC["dtype"]]
    cfg = build_config()
    layer_types = getattr(cfg.get_text_config(), "layer_types", None)
    if layer_types:
        # The order `create_masks_for_generate` makes a composite model's masks in: this
        # process's iteration of the same set (string hashing, random per process).
        record["mask_order"] = list(set(layer_types))
    torch.manual_seed(0)
    stages.begin("weights")
    model = build_model(cfg, dtype)
    stages.end()
    record["parameters"] = sum(p.numel() for p in model.parameters())
    if SPEC["mode"] == "inference":
        hooked(model)
    b, t = SPEC["batch"], SPEC["context"]
    vocab = cfg.get_text_config().vocab_size
    generator = torch.Generator(device=DEVICE).manual_seed(1)
    if SPEC["mode"] == "inference":
        model.eval()
        stages.begin("inputs")
        ids = torch.randint(0, vocab, (b, t), device=DEVICE, generator=generator)
        mask = torch.ones_like(ids)
        stages.end()
        from transformers import LogitsProcessor, LogitsProcessorList

        class Boundary(LogitsProcessor):
            """Ends the prefill stage at the first token's logits and starts the decode stage."""
            calls = 0

            def __call__(self, input_ids, scores):
                if Boundary.calls == 0:
                    stages.end()
                    stages.begin("decode")
                Boundary.calls += 1
                return scores

        stages.begin("prefill")
        out = model.generate(ids, attention_mask=mask, max_new_tokens=SPEC["generated"], do_sample=False,
                             eos_token_id=None, pad_token_id=0, logits_processor=LogitsProcessorList([Boundary()]))
        stages.end()
        record["generated_shape"] = list(out.shape)
        return
    if SPEC.get("checkpointing"):
        model.gradient_checkpointing_enable()
    if SPEC["mode"] in ("lora", "qlora"):
        stages.begin("adapters")
        model = apply_lora(model)
        stages.end()
    model.train()
    hooked(model)
    params = [p for p in model.parameters() if p.requires_grad]
    record["trainable_parameters"] = sum(p.numel() for p in params)
    opt = optimizer_for(params)
    autocast = SPEC.get("autocast")
    scaler = torch.amp.GradScaler("cuda") if autocast == "float16" else None
    stages.begin("inputs")
    ids = torch.randint(0, vocab, (b, t), device=DEVICE, generator=generator)
    stages.end()
    for step in range(1, SPEC.get("steps", 3) + 1):
        stages.begin(f"step{step}.forward")
        if autocast:
            with torch.autocast(DEVICE, dtype=DTYPES[autocast]):
                loss = model(input_ids=ids, labels=ids).loss
        else:
            loss = model(input_ids=ids, labels=ids).loss
        stages.end()
        stages.begin(f"step{step}.backward")
        (scaler.scale(loss) if scaler else loss).backward()
        del loss
        stages.end()
        stages.begin(f"step{step}.optimizer")
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        stages.end()


def sample_outside(stages):
    """What the process holds outside the allocator, sampled before each decoder layer's and
    the head's forward and as each trained parameter's gradient is accumulated: rows of (stage,
    allocations made so far, allocated, reserved, outside). The modules are found as they are
    built (a hook on `nn.Module.__init__`'s callers would change nothing allocated)."""
    rows = []

    def sample(*_):
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        count = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
        rows.append([stages.current[0] if stages.current else None, count,
                     torch.cuda.memory_allocated(), reserved, total - free - reserved])

    def hook_model(model):
        for name, module in model.named_modules():
            if name.endswith("lm_head") or name.split(".")[-1].isdigit() and ".layers." in f".{name}":
                module.register_forward_pre_hook(sample)
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(sample)

    SAMPLERS.append(hook_model)
    return rows


SAMPLERS = []


def hooked(model):
    """`model`, with the outside memory's sampler hooks when the spec asks for them."""
    for hook in SAMPLERS:
        hook(model)
    return model


def trace_events(stacks):
    snapshot = torch.cuda.memory._snapshot()
    events, stack_ids, stack_table = [], {}, []
    for e in snapshot["device_traces"][0]:
        row = [e["action"], e.get("addr", 0), e.get("size", 0), e.get("stream", 0)]
        if stacks and e["action"] == "alloc":
            frames = [(f["filename"].split("site-packages/")[-1], f["line"], f["name"])
                      for f in e.get("frames", []) if any(k in f["filename"] for k in KEEP_FRAMES)][:8]
            key = tuple(frames)
            if key not in stack_ids:
                stack_ids[key] = len(stack_table)
                stack_table.append([list(f) for f in frames])
            row.append(stack_ids[key])
        events.append(row)
    return dict(events=events, stacks=stack_table)


def main():
    if PREQUANTIZE:
        return prequantize(RESULT_PATH)
    record = dict(spec=SPEC)
    record["extra"] = RECORD_EXTRA
    trace = SPEC.get("trace", "none")
    if DRY:
        return dry_main(record)
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # CUDA started: the context exists
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    record["cuda_started"] = dict(free_bytes=free, total_bytes=total, device_used_bytes=total - free,
                                  reserved_bytes=torch.cuda.memory_reserved())
    record["card"] = emulate_card()
    record["environment"] = environment()
    if trace != "none":
        torch.cuda.memory._record_memory_history(
            max_entries=4_000_000, context="alloc" if trace == "stacks" else None,
            stacks="python" if trace == "stacks" else "all")
    stages = Stages(trace != "none")
    record["stages"] = stages.rows
    if SPEC.get("outside_samples"):
        record["outside_samples"] = sample_outside(stages)
    try:
        run(stages, record)
        record["outcome"] = "ok"
    except torch.OutOfMemoryError as e:
        record["outcome"] = "oom"
        record["oom_stage"] = stages.current[0] if stages.current else None
        record["message"] = str(e).splitlines()[0]
    except Exception as e:  # noqa: BLE001 - recorded, then the run is reported as an error
        record["outcome"] = "error"
        record["failed_stage"] = stages.current[0] if stages.current else None
        record["message"] = "".join(traceback.format_exception_only(type(e), e)).strip()
        record["traceback"] = traceback.format_exc()[-4000:]
    stats = torch.cuda.memory_stats()
    record["counters"] = {k: stats.get(k) for k in (
        "num_alloc_retries", "num_ooms", "segment.all.peak", "allocated_bytes.all.peak",
        "reserved_bytes.all.peak", "inactive_split_bytes.all.peak", "requested_bytes.all.peak")}
    free, total = torch.cuda.mem_get_info()
    record["end"] = dict(device_used_bytes=total - free, reserved_bytes=torch.cuda.memory_reserved(),
                         outside_bytes=total - free - torch.cuda.memory_reserved())
    if trace != "none":
        record["markers"] = stages.markers
        record["trace"] = trace_events(trace == "stacks")
    with open(RESULT_PATH, "w") as f:
        json.dump(record, f, separators=(",", ":"))


def dry_main(record):
    """The workload's code on the CPU: that it runs, and its stages; no figure."""
    stages = Stages(False)
    record["stages"] = stages.rows
    try:
        run(stages, record)
        record["outcome"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported
        record["outcome"] = "error"
        record["message"] = "".join(traceback.format_exception_only(type(e), e)).strip()
        record["traceback"] = traceback.format_exc()[-4000:]
    with open(RESULT_PATH, "w") as f:
        json.dump(record, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
