#!/usr/bin/env python3
"""Trains kettle's demo models on the GPU box: a byte-level BPE tokenizer and two
Llama-architecture models sharing it (a target and a small draft), then saves
them in Hugging Face layout with the reference numbers the tests use.

    python3 tools/demo-model/train.py --data DATA --out OUT [--target-minutes 5] [--draft-minutes 2]

DATA is what prepare_data.py wrote (train.txt[.gz], heldout.txt[.gz], chat.jsonl[.gz]).
OUT receives: kettle-demo/ (target), kettle-demo-draft/ (draft), golden/ (transformers'
float32 logits on a held-out passage, for kettle's parity test) and report.json
(steps, losses, held-out perplexity).
"""
import argparse
import gzip
import json
import math
import os
import random
import time

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from reference_perplexity import perplexity  # Hugging Face's sliding-window recipe, shared with the tests' reference

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SHAPES = {
    "kettle-demo": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=6,
                        num_key_value_heads=2, lr=1.5e-3),
    "kettle-demo-draft": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=3,
                              num_key_value_heads=1, lr=2e-3),
}
SEQ = 512
BATCH = 96


def read(data, name):
    for path in (os.path.join(data, name), os.path.join(data, name + ".gz")):
        if os.path.exists(path):
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8") as f:
                return f.read()
    raise FileNotFoundError(name)


def chat_text(pair):
    return (f"<|im_start|>user\n{pair['user'].strip()}<|im_end|>\n"
            f"<|im_start|>assistant\n{pair['assistant'].strip()}<|im_end|>\n")


def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_stream(tok, docs, eot):
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.array(ids, dtype=np.int32)


def make_model(name, vocab):
    shape = {k: v for k, v in SHAPES[name].items() if k != "lr"}
    config = LlamaConfig(vocab_size=vocab, max_position_embeddings=2048, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=2, pad_token_id=0, **shape)
    return LlamaForCausalLM(config)


def train(model, data, minutes, lr, log, fixed_steps=None):
    device = "cuda"
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    tokens = torch.from_numpy(data).to(device)
    n = tokens.numel() - SEQ - 1
    deadline = time.time() + minutes * 60
    # Steps are time-budgeted: time steps 20..60 (past CUDA's start-up), then fix the cosine schedule's length.
    step, total_steps, warmup, losses = 0, fixed_steps, 100, []
    start = time.time()
    t20 = None
    while True:
        if step == 20:
            torch.cuda.synchronize()
            t20 = time.time()
        if total_steps is None and step == 60:
            torch.cuda.synchronize()
            per_step = (time.time() - t20) / 40
            total_steps = max(200, int((minutes * 60 - (time.time() - start)) / per_step) + 60)
        if total_steps is not None and step >= total_steps:
            break
        if fixed_steps is None and time.time() > deadline + 30:
            break
        horizon = total_steps or 10_000
        scale = min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / horizon))))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        starts = torch.randint(0, n, (BATCH,), device=device)
        idx = starts[:, None] + torch.arange(SEQ + 1, device=device)[None, :]
        batch = tokens[idx].long()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item() if step % 50 == 0 else losses[-1] if losses else loss.item())
        if step % 200 == 0:
            log(f"step {step}/{total_steps} loss {loss.item():.3f} lr {lr * scale:.2e} {time.time() - start:.0f}s")
        step += 1
    return {"steps": step, "tokens_seen": step * BATCH * SEQ, "final_loss": float(np.mean(losses[-200:])),
            "seconds": time.time() - start}


def save_model(model, tok_fast, out_dir, eos_ids):
    model = model.to(torch.bfloat16)
    model.config.eos_token_id = eos_ids
    model.generation_config.eos_token_id = eos_ids
    model.generation_config.bos_token_id = None
    model.generation_config.do_sample = True
    model.generation_config.temperature = 0.7
    model.generation_config.top_p = 0.9
    model.generation_config.top_k = 40
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="12MB")
    tok_fast.save_pretrained(out_dir)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--target-minutes", type=float, default=5)
    ap.add_argument("--draft-minutes", type=float, default=2)
    ap.add_argument("--target-steps", type=int, default=None, help="fixed step count instead of a time budget")
    ap.add_argument("--draft-steps", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "train.log"), "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    torch.manual_seed(0)
    random.seed(0)
    docs = [d for d in read(args.data, "train.txt").split("\n\n") if d.strip()]
    heldout = read(args.data, "heldout.txt")
    pairs = [json.loads(l) for l in read(args.data, "chat.jsonl").splitlines() if l.strip()]
    chats = [chat_text(p) for p in pairs]
    log(f"{len(docs)} documents, {len(chats)} chat pairs, held-out {len(heldout)} chars")

    tok = train_tokenizer(docs + chats, args.vocab)
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    tok_fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                       pad_token="<|endoftext|>", unk_token=None)
    tok_fast.chat_template = CHAT_TEMPLATE
    all_docs = docs + chats
    random.shuffle(all_docs)
    data = encode_stream(tok, all_docs, eot)
    held_ids = tok.encode(heldout).ids
    log(f"tokenizer: vocab {tok.get_vocab_size()}, {len(data)} training tokens, {len(held_ids)} held-out tokens")

    report = {"training_tokens": int(len(data)), "heldout_tokens": len(held_ids), "seq": SEQ, "batch": BATCH}
    runs = (("kettle-demo", args.target_minutes, args.target_steps),
            ("kettle-demo-draft", args.draft_minutes, args.draft_steps))
    for name, minutes, fixed_steps in runs:
        model = make_model(name, tok.get_vocab_size())
        params = sum(p.numel() for p in model.parameters())
        log(f"{name}: {params / 1e6:.2f} M parameters")
        stats = train(model, data, minutes, SHAPES[name]["lr"], log, fixed_steps)
        out_dir = os.path.join(args.out, name)
        save_model(model, tok_fast, out_dir, [im_end, eot])
        # Reference numbers from the saved bf16 checkpoint, reloaded and run in float32.
        ref = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to("cuda")
        ppl, n = perplexity(ref, held_ids)
        stats.update({"parameters": params, "heldout_perplexity_ctx512_stride256": ppl, "heldout_scored_tokens": n})
        log(f"{name}: {stats}")
        report[name] = stats
        if name == "kettle-demo":
            golden_dir = os.path.join(args.out, "golden")
            os.makedirs(golden_dir, exist_ok=True)
            prompt = held_ids[:96]
            with torch.no_grad():
                logits = ref(input_ids=torch.tensor([prompt], device="cuda")).logits[0].float().cpu().numpy()
                gen = ref.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=24, do_sample=False,
                                   pad_token_id=eot)
            logits.astype("<f4").tofile(os.path.join(golden_dir, "logits.f32"))
            json.dump({"model_type": "llama", "prompt_ids": prompt, "logits_shape": list(logits.shape),
                       "logits_file": "logits.f32", "logits_dtype": "float32 little-endian, row-major [position][vocab]",
                       "greedy_new_tokens": gen[0, len(prompt):].tolist(),
                       "prompt_text": tok.decode(prompt),
                       "reference": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
                                    "float32 compute on the saved bf16 weights"},
                      open(os.path.join(golden_dir, "golden.json"), "w"), indent=1)
            chat = tok_fast.apply_chat_template([{"role": "user", "content": "What does kettle mean?"}],
                                                add_generation_prompt=True, return_tensors="pt")
            chat = chat["input_ids"] if hasattr(chat, "keys") else chat
            sample = ref.generate(chat.to("cuda"), max_new_tokens=48, do_sample=False, eos_token_id=[im_end, eot],
                                  pad_token_id=eot)
            report["sample_chat"] = tok.decode(sample[0, chat.shape[1]:].tolist())
            text_prompt = tok.encode("In the beginning").ids
            torch.manual_seed(1)
            sample = ref.generate(torch.tensor([text_prompt], device="cuda"), max_new_tokens=48, do_sample=True,
                                  temperature=0.7, top_p=0.9, eos_token_id=[eot], pad_token_id=eot)
            report["sample_text"] = "In the beginning" + tok.decode(sample[0, len(text_prompt):].tolist())
            log(f"samples: {report['sample_chat']!r} / {report['sample_text']!r}")
        del ref, model
        torch.cuda.empty_cache()
    json.dump(report, open(os.path.join(args.out, "report.json"), "w"), indent=1)
    log(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
