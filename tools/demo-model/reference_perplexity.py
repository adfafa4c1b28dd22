#!/usr/bin/env python3
"""transformers' perplexity of a model on a text file (GPU box), by Hugging
Face's sliding-window recipe, for kettle's perplexity test.

    python3 reference_perplexity.py MODEL_DIR TEXT_FILE OUT_JSON [CONTEXT:STRIDE ...]
"""
import json
import math
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


@torch.no_grad()
def perplexity(model, ids, context=512, stride=256):
    ids = torch.tensor([ids], device="cuda")
    nll_sum, n_tokens, prev_end = 0.0, 0, 0
    for begin in range(0, ids.size(1), stride):
        end = min(begin + context, ids.size(1))
        target_len = end - prev_end
        window = ids[:, begin:end]
        targets = window.clone()
        targets[:, :-target_len] = -100
        logits = model(input_ids=window).logits.float()
        losses = torch.nn.functional.cross_entropy(logits[0, :-1], targets[0, 1:], ignore_index=-100, reduction="sum")
        nll_sum += losses.item()
        n_tokens += int((targets[0, 1:] != -100).sum().item())
        prev_end = end
        if end == ids.size(1):
            break
    return math.exp(nll_sum / n_tokens), n_tokens


def main():
    model_dir, text_file, out = sys.argv[1:4]
    settings = [tuple(int(x) for x in s.split(":")) for s in (sys.argv[4:] or ["512:256"])]
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(open(text_file, encoding="utf-8").read())["input_ids"]
    results = {"tokens": len(ids), "runs": []}
    for how in ("cast_bf16_then_float", "float32"):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if how == "cast_bf16_then_float":
            model = model.to(torch.bfloat16).float()
        model = model.to("cuda").eval()
        for context, stride in settings:
            ppl, n = perplexity(model, ids, context, stride)
            results["runs"].append({"load": how, "context": context, "stride": stride, "perplexity": ppl,
                                    "scored_tokens": n})
    json.dump(results, open(out, "w"), indent=1)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
