# Writes a random-weight Qwen3-MoE GGUF (llama.cpp's qwen3moe architecture)
# of the Qwen3-30B-A3B shape, or fewer of its layers, with a real vocabulary
# copied from a vocab-only GGUF, and the matching config.json for
# `kettle bench --synthetic CONFIG`: the same shape in both engines (the
# weights' values do not matter for timing). numpy and llama.cpp's gguf-py.
#
#   python3 bench/make_random_moe_gguf.py GGUF_PY VOCAB.gguf OUT.gguf OUT_CONFIG.json [LAYERS] [tiny]
# LAYERS (default 16 of 48: about 20 GB in f16, inside the GPU box's disk beside the
# dense GGUFs); `tiny` writes a 2-layer, 8-expert model of hidden size 64 to check the
# file here.
import json, sys
import numpy as np

sys.path.insert(0, sys.argv[1])
import gguf  # noqa: E402

vocab_path, out, config_out = sys.argv[2], sys.argv[3], sys.argv[4]
layers = int(sys.argv[5]) if len(sys.argv) > 5 else 16
tiny = len(sys.argv) > 6 and sys.argv[6] == "tiny"
# Qwen3-30B-A3B's config.json (hidden 2048, 32 query / 4 KV heads of 128, 128 experts of
# width 768, 8 routed per token), or a tiny one.
S = dict(h=64, heads=4, kv=2, hd=16, experts=8, used=2, ff_exp=32, ff=96) if tiny else \
    dict(h=2048, heads=32, kv=4, hd=128, experts=128, used=8, ff_exp=768, ff=6144)

reader = gguf.GGUFReader(vocab_path)
writer = gguf.GGUFWriter(out, "qwen3moe")
n_vocab = None
for name, f in reader.fields.items():
    if not name.startswith("tokenizer."):
        continue
    value = f.contents()
    if name == "tokenizer.ggml.tokens":
        n_vocab = len(value)
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        writer.add_key_value(name, value, f.types[0], sub_type=f.types[-1])
    else:
        writer.add_key_value(name, value, f.types[0])
h, hd = S["h"], S["hd"]
writer.add_context_length(40960)
writer.add_embedding_length(h)
writer.add_block_count(layers)
writer.add_feed_forward_length(S["ff"])
writer.add_head_count(S["heads"])
writer.add_head_count_kv(S["kv"])
writer.add_key_length(hd)
writer.add_value_length(hd)
writer.add_rope_dimension_count(hd)
writer.add_rope_freq_base(1000000.0)
writer.add_layer_norm_rms_eps(1e-6)
writer.add_expert_count(S["experts"])
writer.add_expert_used_count(S["used"])
writer.add_expert_feed_forward_length(S["ff_exp"])
writer.add_vocab_size(n_vocab)
writer.add_file_type(1)  # mostly F16

rng = np.random.default_rng(0)
pool = (rng.standard_normal(1 << 22) * 0.02).astype(np.float16)


def t(shape):  # a tiled random block: fast to make, not zeros; numpy shape = ggml's ne reversed
    n = int(np.prod(shape))
    return np.tile(pool, -(-n // pool.size))[:n].reshape(shape)


ones = lambda n: np.ones(n, dtype=np.float32)
writer.add_tensor("token_embd.weight", t((n_vocab, h)))
for i in range(layers):
    p = f"blk.{i}."
    writer.add_tensor(p + "attn_norm.weight", ones(h))
    writer.add_tensor(p + "attn_q.weight", t((S["heads"] * hd, h)))
    writer.add_tensor(p + "attn_k.weight", t((S["kv"] * hd, h)))
    writer.add_tensor(p + "attn_v.weight", t((S["kv"] * hd, h)))
    writer.add_tensor(p + "attn_output.weight", t((h, S["heads"] * hd)))
    writer.add_tensor(p + "attn_q_norm.weight", ones(hd))
    writer.add_tensor(p + "attn_k_norm.weight", ones(hd))
    writer.add_tensor(p + "ffn_norm.weight", ones(h))
    writer.add_tensor(p + "ffn_gate_inp.weight", t((S["experts"], h)).astype(np.float32))  # the router: f32, as convert_hf_to_gguf keeps it
    writer.add_tensor(p + "ffn_gate_exps.weight", t((S["experts"], S["ff_exp"], h)))
    writer.add_tensor(p + "ffn_up_exps.weight", t((S["experts"], S["ff_exp"], h)))
    writer.add_tensor(p + "ffn_down_exps.weight", t((S["experts"], h, S["ff_exp"])))
writer.add_tensor("output_norm.weight", ones(h))
writer.add_tensor("output.weight", t((n_vocab, h)))
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()

# The same shape for kettle: the vocabulary the GGUF carries, the layers written.
config = {"model_type": "qwen3_moe", "vocab_size": n_vocab, "hidden_size": h, "intermediate_size": S["ff"],
          "moe_intermediate_size": S["ff_exp"], "num_hidden_layers": layers, "num_attention_heads": S["heads"],
          "num_key_value_heads": S["kv"], "head_dim": hd, "num_experts": S["experts"],
          "num_experts_per_tok": S["used"], "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
          "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
          "rope_theta": 1000000.0}
with open(config_out, "w") as f:
    json.dump(config, f, indent=1)
print("wrote", out, "and", config_out, "vocab", n_vocab, "layers", layers)
