#!/usr/bin/env python3
"""Embedding goldens: tiny decoder embedding models with random weights, saved as
sentence-transformers writes them, and what sentence-transformers (over
transformers) computes for a few texts. Runs where torch, transformers and
sentence-transformers are installed (the GPU box); CPU, float32 from the
bf16-stored weights.

  python3 scripts/make-embedding-goldens.py TOKENIZER_JSON OUT_DIR

Cases:
  qwen3_last  Qwen3 base model (weights without the "model." prefix, as
              Qwen3-Embedding ships them), last-token pooling, Normalize,
              a "query" instruction prompt, a tokenizer that appends
              <|endoftext|>, and is_matryoshka (dimensions).
  llama_mean  Llama as a causal-LM checkpoint ("model." prefix and lm_head,
              which an embedding model ignores), mean pooling, no Normalize.
"""
import json
import os
import shutil
import sys
import tempfile

import torch
from sentence_transformers import SentenceTransformer, models
from transformers import AutoModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

TEXTS = [
    "The kettle is on.",
    "Où est la gare ? 東京駅はどこですか — a mixed line.",
    "a",
    " ".join(["Embeddings pool a decoder's hidden states into one vector per text;"] * 12),
]
QUERY = "Instruct: Given a question, find the passages that answer it\nQuery: "


def tokenizer(tokenizer_json, folder, append_eos):
    spec = json.load(open(tokenizer_json))
    if append_eos:  # as Qwen3-Embedding's tokenizer does: every text ends with <|endoftext|>
        spec["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
            "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
        }
    path = os.path.join(folder, "tokenizer.json")
    json.dump(spec, open(path, "w"), ensure_ascii=False)
    tok = PreTrainedTokenizerFast(tokenizer_file=path, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.save_pretrained(folder)
    return tok


def build(case, tokenizer_json, out):
    torch.manual_seed(7 if case == "qwen3_last" else 11)
    tmp = tempfile.mkdtemp()
    common = dict(vocab_size=4096, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.08)
    if case == "qwen3_last":
        config = Qwen3Config(head_dim=32, tie_word_embeddings=True, **common)
        model = Qwen3Model(config)
    else:
        config = LlamaConfig(head_dim=16, tie_word_embeddings=False, **common)
        model = LlamaForCausalLM(config)
    # Visible per-channel norm weights, so a wrong norm shows in the embedding.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    model.save_pretrained(tmp)
    tokenizer(tokenizer_json, tmp, append_eos=case == "qwen3_last")

    word = models.Transformer(tmp, max_seq_length=512)
    pooling = models.Pooling(64, pooling_mode="lasttoken" if case == "qwen3_last" else "mean")
    modules = [word, pooling] + ([models.Normalize()] if case == "qwen3_last" else [])
    prompts = {"query": QUERY, "document": ""} if case == "qwen3_last" else {}
    st = SentenceTransformer(modules=modules, prompts=prompts, device="cpu")
    dest = os.path.join(out, case, "model")
    shutil.rmtree(dest, ignore_errors=True)
    st.save(dest)
    if case == "qwen3_last":
        cfg = json.load(open(os.path.join(dest, "config.json")))
        cfg["is_matryoshka"] = True
        json.dump(cfg, open(os.path.join(dest, "config.json"), "w"), indent=2)
    else:  # the causal-LM checkpoint itself: "model."-prefixed names and an lm_head
        for f in os.listdir(dest):
            if f.startswith("model") and f.endswith((".safetensors", ".json")):
                os.remove(os.path.join(dest, f))
        for f in os.listdir(tmp):
            if f.startswith("model") or f == "config.json":
                shutil.copy(os.path.join(tmp, f), os.path.join(dest, f))

    # The reference, from the saved folder as a user would load it.
    ref = SentenceTransformer(dest, device="cpu").float()
    hf = AutoModel.from_pretrained(dest, dtype=torch.float32).eval()
    rows = []
    names = [None, "query"] if prompts else [None]
    for prompt_name in names:
        for text in TEXTS:
            full = (prompts[prompt_name] if prompt_name else "") + text
            ids = ref.tokenizer(full)["input_ids"]
            assert len(ids) <= 512, (case, len(ids))  # sentence-transformers would cut it at max_seq_length
            emb = ref.encode([text], prompt_name=prompt_name, batch_size=1, convert_to_tensor=True)[0].cpu()
            # The same pooling by hand from transformers' hidden states: the reference is what we think it is.
            with torch.no_grad():
                hidden = hf(input_ids=torch.tensor([ids])).last_hidden_state[0].double()
            mine = hidden[-1] if case == "qwen3_last" else hidden.mean(0)
            if case == "qwen3_last":
                mine = mine / mine.norm()
            cos = float(torch.nn.functional.cosine_similarity(mine, emb.double(), dim=0))
            assert cos > 0.99999, (case, text, cos)
            row = {"text": text, "prompt_name": prompt_name, "input_ids": ids, "embedding": emb.double().tolist()}
            if case == "qwen3_last":
                t = emb[:32].double()
                row["dimensions"] = 32
                row["embedding_truncated"] = (t / t.norm()).tolist()
            rows.append(row)
    golden = {
        "made_with": f"sentence-transformers over transformers, torch {torch.__version__}, float32 CPU from bf16 weights",
        "pooling": "lasttoken" if case == "qwen3_last" else "mean",
        "normalize": case == "qwen3_last",
        "cases": rows,
    }
    json.dump(golden, open(os.path.join(out, case, "golden.json"), "w"), indent=1)
    print(case, "->", dest, sorted(os.listdir(dest)))


if __name__ == "__main__":
    tokenizer_json, out = sys.argv[1], sys.argv[2]
    for case in ("qwen3_last", "llama_mean"):
        build(case, tokenizer_json, out)
