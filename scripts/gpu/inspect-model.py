#!/usr/bin/env python3
"""What transformers builds from a configuration, read on the meta device (no memory used): the
class `AutoModelForCausalLM` gives, the configuration as it reads it, every parameter and buffer in
order (name, shape, dtype, persistent), the checkpoint's keys as `save_pretrained` writes them,
the modules PEFT LoRA targets, and the source of the forward methods named.

    python3 scripts/gpu/inspect-model.py NAME [--lora q_proj,v_proj] [--source Class.method ...]

NAME is a public configuration of scripts/gpu/hf_workloads.py, or `small:MODEL_TYPE`. Prints JSON.
"""
import argparse
import importlib
import inspect
import json

import torch
from hf_workloads import PUBLIC, small


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--lora", default="")
    ap.add_argument("--source", nargs="*", default=[])
    args = ap.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM
    if args.name.startswith("small:"):
        model_type = args.name.split(":", 1)[1]
        fields = small(model_type)
    else:
        model_type, fields = PUBLIC[args.name]
    cfg = AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    state = model.state_dict()
    out = dict(
        model_class=type(model).__name__,
        config=cfg.to_dict(),
        parameters=[[n, list(p.shape), str(p.dtype)] for n, p in model.named_parameters()],
        buffers=[[n, list(b.shape), str(b.dtype), n in state] for n, b in model.named_buffers()],
        checkpoint_keys=sorted(state),
        tied=getattr(model, "_tied_weights_keys", None),
        modules=[n for n, _ in model.named_modules()][:400],
    )
    if args.lora:
        from peft import LoraConfig, get_peft_model
        peft = get_peft_model(model, LoraConfig(r=8, target_modules=args.lora.split(","), task_type="CAUSAL_LM"))
        out["lora_modules"] = [n for n, m in peft.named_modules() if hasattr(m, "lora_A")]
    sources = {}
    for item in args.source:
        module, _, qual = item.rpartition(":")
        obj = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
        sources[item] = inspect.getsource(obj)
    out["sources"] = sources
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
