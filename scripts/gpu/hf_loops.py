"""The runs users launch beyond the hand-written loop of hf-run.py, each measured stage by stage
in the process that runs it (scripts/gpu/hf-run.py calls `loop_of(SPEC)`):

- `distributed` {strategy, world_size, rank}: this process is rank `rank` of `world_size` through
  PyTorch's fake process group (collectives allocate their outputs through the real caching
  allocator and move no data; no NCCL buffer exists):
  - `fsdp`: FSDP2 as torchtitan and accelerate apply it: the model built on `meta` in float32,
    `fully_shard` on every decoder layer then on the root with
    `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` (or with
    `"mixed_precision": false`, built in `dtype` and no policy), `to_empty` on the GPU;
    full training or PEFT LoRA, recomputation optional, AdamW as shipped;
  - `ddp`: `DistributedDataParallel` of the model built on the GPU (its default buckets), its
    all-reduce a comm hook returning the bucket in place (what NCCL's in-place all-reduce
    allocates: nothing);
  - `tp`: `from_pretrained(..., tp_plan="auto")` of a checkpoint on disk, then `generate`;
- `loop` = `trainer` or `sft`: `transformers.Trainer` or TRL's `SFTTrainer` with the arguments of
  `trainer_args` over a tokenized dataset (right padding to the longest of each batch, sequence
  lengths cycling through `lengths`, else all `context` long; with `sequential_batches` the
  batches taken in the dataset's order rather than shuffled; `completion_tokens` N: the loss on
  each row's last N tokens alone, as TRL's `completion_only_loss` labels them), stages marked by
  a subclass;
- inference with `generate` (keyword arguments of `generate` as called: sampling, beams, a cache
  implementation) and `left_padding` (each row's count of pad tokens on the left, cycling).

Stages: `weights`, `inputs`, then `stepN.forward`, `stepN.backward`, `stepN.clip` (the Trainer's
gradient clipping), `stepN.optimizer`; `prefill`, `decode` for `generate`.
"""
import os
import tempfile

import torch


def loop_of(spec):
    """The function running `spec`, or None for hf-run.py's own loops."""
    d = spec.get("distributed")
    if d:
        return {"fsdp": fsdp, "ddp": ddp, "tp": tensor_parallel}[d["strategy"]]
    if spec.get("loop") in ("trainer", "sft"):
        return trainer
    if spec["mode"] == "inference" and ("generate" in spec or "left_padding" in spec):
        return generate_variant
    return None


def init_group(d):
    """This process as rank `rank` of `world_size`: through the fake process group on one GPU, or
    with `"backend": "nccl"` through NCCL, one process per GPU (the GPU given to it as device 0 by
    `scripts/gpu/real-ranks.py`)."""
    import torch.distributed as dist
    world_size, rank = d["world_size"], d["rank"]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(d.get("port", 29511)))
    if d.get("backend") == "nccl":
        dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=torch.device("cuda", 0))
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def decoder_layers(model):
    """The decoder layers of a causal LM, under PEFT's wrapper too."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.model
    return inner.language_model.layers if hasattr(inner, "language_model") else inner.layers


def train_steps(spec, stages, model, ids, optimizer, h):
    """The hand-written loop of hf-run.py (forward, backward, step, zero_grad), with autocast."""
    autocast = spec.get("autocast")
    for step in range(1, spec.get("steps", 2) + 1):
        stages.begin(f"step{step}.forward")
        if autocast:
            with torch.autocast(h.DEVICE, dtype=h.DTYPES[autocast]):
                loss = model(input_ids=ids, labels=ids).loss
        else:
            loss = model(input_ids=ids, labels=ids).loss
        stages.end()
        stages.begin(f"step{step}.backward")
        loss.backward()
        del loss
        stages.end()
        stages.begin(f"step{step}.optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stages.end()


def random_ids(spec, vocab, h, batch=None):
    generator = torch.Generator(device=h.DEVICE).manual_seed(1)
    return torch.randint(0, vocab, (batch or spec["batch"], spec["context"]), device=h.DEVICE,
                         generator=generator)


def fsdp(spec, stages, record, h):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM
    d = spec["distributed"]
    init_group(d)
    cfg = h.build_config()
    mesh = init_device_mesh(h.DEVICE, (d["world_size"],))
    torch.manual_seed(0)
    # Under mixed precision (the default) the model is built in float32 and gathered in
    # `param_dtype`; without, built, gathered and reduced in `dtype`.
    mixed = d.get("mixed_precision", True)
    stages.begin("weights")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32 if mixed else h.DTYPES[spec["dtype"]],
                                                 attn_implementation=spec.get("attn_implementation", "sdpa"))
    if spec.get("checkpointing"):
        model.gradient_checkpointing_enable()
    if spec["mode"] == "lora":
        model = h.apply_lora(model)
    mp = MixedPrecisionPolicy(param_dtype=h.DTYPES[spec.get("param_dtype", "bfloat16")],
                              reduce_dtype=h.DTYPES[spec.get("reduce_dtype", "float32")]) if mixed else MixedPrecisionPolicy()
    reshard = spec.get("reshard_after_forward", True)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    model.to_empty(device=h.DEVICE)
    stages.end()
    record["parameters"] = sum(p.numel() for p in model.parameters())
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    record["trainable_parameters"] = sum(p.numel() for p in params)
    opt = h.optimizer_for(params)
    stages.begin("inputs")
    ids = random_ids(spec, cfg.get_text_config().vocab_size, h)
    stages.end()
    train_steps(spec, stages, model, ids, opt, h)


def ddp(spec, stages, record, h):
    from torch.nn.parallel import DistributedDataParallel
    d = spec["distributed"]
    init_group(d)
    cfg = h.build_config()
    dtype = h.DTYPES["float32" if spec.get("autocast") else spec["dtype"]]
    torch.manual_seed(0)
    stages.begin("weights")
    model = h.build_model(cfg, dtype)
    stages.end()
    if spec.get("checkpointing"):
        model.gradient_checkpointing_enable()
    if spec["mode"] == "lora":
        stages.begin("adapters")
        model = h.apply_lora(model)
        stages.end()
    model.train()
    stages.begin("ddp")
    wrapped = DistributedDataParallel(
        model, device_ids=None if h.DRY else [0],
        bucket_cap_mb=spec.get("bucket_cap_mb", 25),
        gradient_as_bucket_view=spec.get("gradient_as_bucket_view", False))

    def in_place_all_reduce(_, bucket):
        # What NCCL's in-place all-reduce gives back: the bucket itself, nothing allocated.
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    if d.get("backend") != "nccl":
        wrapped.register_comm_hook(None, in_place_all_reduce)
    stages.end()
    record["parameters"] = sum(p.numel() for p in model.parameters())
    params = [p for p in wrapped.parameters() if p.requires_grad]
    record["trainable_parameters"] = sum(p.numel() for p in params)
    opt = h.optimizer_for(params)
    stages.begin("inputs")
    ids = random_ids(spec, cfg.get_text_config().vocab_size, h)
    stages.end()
    train_steps(spec, stages, wrapped, ids, opt, h)


def tensor_parallel(spec, stages, record, h):
    from transformers import AutoModelForCausalLM
    d = spec["distributed"]
    init_group(d)
    cfg = h.build_config()
    dtype = h.DTYPES[spec["dtype"]]
    folder = tempfile.mkdtemp(prefix="igl-tp-")
    h.write_sparse_checkpoint(cfg, dtype, folder)
    torch.manual_seed(0)
    stages.begin("weights")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, tp_plan="auto",
                                                 attn_implementation=spec.get("attn_implementation", "sdpa"))
    stages.end()
    record["parameters"] = sum(p.numel() for p in model.parameters())
    model.eval()
    run_generate(spec, stages, record, model, cfg, h)


def generate_variant(spec, stages, record, h):
    cfg = h.build_config()
    torch.manual_seed(0)
    stages.begin("weights")
    model = h.build_model(cfg, h.DTYPES[spec["dtype"]])
    stages.end()
    record["parameters"] = sum(p.numel() for p in model.parameters())
    model.eval()
    run_generate(spec, stages, record, model, cfg, h)


def run_generate(spec, stages, record, model, cfg, h):
    """`generate` as called: the spec's keyword arguments, left padding where asked (the explicit
    attention mask a tokenizer's padded batch brings); `prefill` ends at the first token's
    logits."""
    from transformers import LogitsProcessor, LogitsProcessorList
    b, t = spec["batch"], spec["context"]
    stages.begin("inputs")
    ids = random_ids(spec, cfg.get_text_config().vocab_size, h)
    mask = torch.ones_like(ids)
    pads = spec.get("left_padding") or [0]
    for row in range(b):
        pad = min(pads[row % len(pads)], t - 1)
        if pad:
            ids[row, :pad] = 0
            mask[row, :pad] = 0
    stages.end()

    class Boundary(LogitsProcessor):
        calls = 0

        def __call__(self, input_ids, scores):
            if Boundary.calls == 0:
                stages.end()
                stages.begin("decode")
            Boundary.calls += 1
            return scores

    kwargs = dict(max_new_tokens=spec["generated"], eos_token_id=None, pad_token_id=0)
    kwargs.update(spec.get("generate", {}))
    if "max_length" in kwargs:
        kwargs.pop("max_new_tokens")
    stages.begin("prefill")
    out = model.generate(ids, attention_mask=mask, logits_processor=LogitsProcessorList([Boundary()]), **kwargs)
    stages.end()
    record["generated_shape"] = list(out.shape)


def tokenizer_of(vocab):
    """A tokenizer of `vocab` tokens built here (no download): token 0 pads, 1 ends a sequence."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    words = {"[PAD]": 0, "[EOS]": 1, "[UNK]": 2}
    words.update({f"t{i}": i for i in range(3, vocab)})
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(words, unk_token="[UNK]")),
                                  pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]")
    return tok


def sft_dataset(rows, completion=None):
    """A `datasets.Dataset` of the tokenized rows (what SFTTrainer takes); with `completion`, each
    row's labels as TRL's preparation leaves a prompt-completion row under `completion_only_loss`
    (its last `completion` tokens, -100 on the prompt). Its fingerprints name cache files only;
    they are given rather than hashed, since datasets' hashing pickles pyarrow types that some
    pyarrow versions refuse."""
    import datasets
    import datasets.arrow_dataset as arrow
    import datasets.fingerprint as fingerprint
    names = iter(range(1 << 30))
    arrow.generate_fingerprint = lambda *_: f"igl{next(names)}"
    fingerprint.update_fingerprint = lambda *_, **__: f"igl{next(names)}"
    columns = {"input_ids": rows}
    if completion:
        columns["labels"] = [[-100] * (len(r) - completion) + r[-completion:] for r in rows]
    return datasets.Dataset.from_dict(columns)


def lengths_of(spec, count):
    """Each sequence's length: `lengths` cycled, else every one `context` long."""
    lengths = spec.get("lengths") or [spec["context"]]
    return [lengths[i % len(lengths)] for i in range(count)]


def trainer(spec, stages, record, h):
    from transformers import Trainer, TrainerCallback, TrainingArguments
    cfg = h.build_config()
    vocab = cfg.get_text_config().vocab_size
    dtype = h.DTYPES[spec["dtype"]]
    torch.manual_seed(0)
    stages.begin("weights")
    model = h.build_model(cfg, dtype)
    stages.end()
    if spec["mode"] in ("lora", "qlora"):
        stages.begin("adapters")
        model = h.apply_lora(model)
        stages.end()
    record["parameters"] = sum(p.numel() for p in model.parameters())
    record["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    steps = spec.get("steps", 2)
    args = dict(spec.get("trainer_args", {}))
    accumulation = args.get("gradient_accumulation_steps", 1)
    count = spec["batch"] * steps * accumulation
    rng = torch.Generator().manual_seed(2)
    rows = [torch.randint(3, vocab, (n,), generator=rng).tolist() for n in lengths_of(spec, count)]
    # A tokenized dataset as a list of examples (datasets' own class would hash its functions
    # with dill, which fails with some pyarrow versions: a list is what Trainer iterates alike).
    data = [{"input_ids": r} for r in rows]
    output = tempfile.mkdtemp(prefix="igl-trainer-")
    common = dict(output_dir=output, per_device_train_batch_size=spec["batch"], max_steps=steps,
                  report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
                  dataloader_num_workers=0, gradient_checkpointing=bool(spec.get("checkpointing")),
                  use_cpu=h.DRY, seed=0, data_seed=0)
    common.update(args)
    marks = dict(step=0, micro=0)

    def name(part):
        micro = f".micro{marks['micro']}" if accumulation > 1 else ""
        return f"step{marks['step']}{micro}.{part}"

    class Marks(TrainerCallback):
        def on_step_begin(self, *_, **__):
            if stages.current:
                stages.end()
            marks["step"] += 1
            marks["micro"] = 0

        def on_pre_optimizer_step(self, *_, **__):
            stages.end()
            stages.begin(name("optimizer"))

        def on_step_end(self, *_, **__):
            stages.end()

    class Marked:
        """Marks the forward (from the step's start, the inputs' copy to the GPU included, to the
        loss), the backward and the clipping."""

        def training_step(self, model, inputs, num_items_in_batch=None):
            if stages.current:
                stages.end()
            marks["micro"] += 1
            stages.begin(name("forward"))
            return super().training_step(model, inputs, num_items_in_batch)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                       num_items_in_batch=num_items_in_batch)
            if model.training:
                stages.end()
                stages.begin(name("backward"))
            return out

        def _clip_grad_norm(self, model):
            stages.end()
            stages.begin(name("clip"))
            return super()._clip_grad_norm(model)

    if spec.get("sequential_batches"):
        # Each batch the rows in order: a padded batch holds the lengths it was planned with.
        assert hasattr(Trainer, "_get_train_sampler"), "Trainer picks its sampler elsewhere"

        class InOrder:
            def _get_train_sampler(self, *_, **__):
                return torch.utils.data.SequentialSampler(self.train_dataset)

        Marked = type("MarkedInOrder", (Marked, InOrder), {})  # noqa: N806
    if spec["loop"] == "sft":
        from trl import SFTConfig, SFTTrainer
        data = sft_dataset(rows, spec.get("completion_tokens"))
        # The dataset is tokenized already: nothing for TRL to prepare.
        config = SFTConfig(**common, dataset_kwargs={"skip_prepare_dataset": True})
        record["trainer_arguments"] = config.to_dict()
        base = type("MarkedSFT", (Marked, SFTTrainer), {})
        t = base(model=model, args=config, train_dataset=data, processing_class=tokenizer_of(vocab),
                 callbacks=[Marks()])
    else:
        from transformers import DataCollatorForLanguageModeling
        targs = TrainingArguments(**common)
        record["trainer_arguments"] = targs.to_dict()
        base = type("MarkedTrainer", (Marked, Trainer), {})
        t = base(model=model, args=targs, train_dataset=data, callbacks=[Marks()],
                 data_collator=DataCollatorForLanguageModeling(tokenizer_of(vocab), mlm=False))
    stages.begin("setup")
    t.train()
    if stages.current:
        stages.end()
