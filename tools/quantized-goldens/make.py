#!/usr/bin/env python3
"""Quantized golden cases: the tiny golden models (tests/data/goldens) written
in the quantized layouts people download — MLX affine (mixed bits, groups of
32 and 64, quantized embeddings and heads, MoE experts stacked as mlx-lm's
switch_mlp), AutoAWQ (GEMM), AutoGPTQ (the original format) and FP8 (block
scales, and compressed-tensors' per-channel scales) — by this script's own
packers (numpy, independent of kettle's C++), with the reference outputs of
Hugging Face transformers on the weights those files stand for.

    python3 tools/quantized-goldens/make.py OUT_DIR [CASE ...]

Quantizing needs numpy alone (`--pack-only` stops there, writing each case's
dense f32 twin in dense/ instead of the references); the references need
torch and transformers (the GPU box). Each case OUT_DIR/<model>-<format>/
holds model/ (config.json with the format's quantization keys,
model.safetensors), golden.json (prompt_ids, logits_shape,
greedy_new_tokens, reference), logits.f32 (transformers' float32 logits of
the golden prompt) and greedy_logits.f32 (its logits at each of the 24
greedy steps), all computed with the dequantized weights in float32 (FP8:
the bf16 rounding of code × scale, as kettle widens FP8 at load).
"""
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDENS = os.path.join(HERE, "..", "..", "tests", "data", "goldens")

# model → formats. Each format: a name and how its modules are chosen.
CASES = {
    "llama": ["mlx-mixed-g64", "mlx-3bit-g32", "awq-g32", "gptq-8bit-g32", "fp8-block32"],
    "qwen2": ["mlx-mixed-g64", "awq-g32"],
    "qwen3": ["mlx-mixed-g64", "fp8-channel"],
    "mistral": ["mlx-mixed-g64"],
    "gemma2": ["mlx-mixed-g64"],
    "gemma3": ["mlx-mixed-g64"],
    "phi3": ["mlx-mixed-g64", "gptq-4bit-g32"],
    "qwen3_moe": ["mlx-mixed-g64", "mlx-3bit-g32", "awq-g32"],
    "mixtral": ["mlx-mixed-g64"],
}


# ---- safetensors ----

DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2), "U32": (np.uint32, 4),
          "I32": (np.int32, 4), "F8_E4M3": (np.uint8, 1)}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        np_type, _ = DTYPES[info["dtype"]]
        out[name] = (info["dtype"], np.frombuffer(data[a:b], dtype=np_type).reshape(info["shape"]).copy())
    return out


def write_safetensors(path, tensors):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dtype, array = tensors[name]
        blob = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values):  # round to nearest even
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def as_f32(dtype, array):
    if dtype == "BF16":
        return bf16_to_f32(array)
    return array.astype(np.float32)


# ---- MLX affine: w = s·q + b per group along the input, codes LSB-first in a u32 stream per row ----

def mlx_quantize(w, bits, group):
    """w [..., in] f32 → (codes u32 [..., in·bits/32], scales bf16, biases bf16, dequantized f32)."""
    shape = w.shape
    g = w.reshape(-1, shape[-1] // group, group)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    levels = (1 << bits) - 1
    scale = f32_to_bf16(np.maximum((hi - lo) / levels, 1e-8))
    bias = f32_to_bf16(lo)
    s, b = bf16_to_f32(scale)[..., None], bf16_to_f32(bias)[..., None]
    q = np.clip(np.rint((g - b) / s), 0, levels).astype(np.uint32)
    deq = (s * q.astype(np.float32) + b).reshape(shape)
    rows = q.reshape(-1, shape[-1])
    bit_planes = ((rows[:, :, None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    stream = bit_planes.reshape(rows.shape[0], -1)  # bit j·bits + k of a row = bit k of code j
    packed = np.packbits(stream.reshape(rows.shape[0], -1, 8), axis=-1, bitorder="little")
    codes = packed.reshape(rows.shape[0], -1).view("<u4").reshape(*shape[:-1], shape[-1] * bits // 32)
    groups_shape = (*shape[:-1], shape[-1] // group)
    return codes, scale.reshape(groups_shape), bias.reshape(groups_shape), deq


# ---- AWQ / GPTQ: zero-point int codes, w = s·(q − z), groups along the input ----

def zero_point_quantize(w, bits, group):
    """w [out, in] → q [in, out], z [groups, out], s f16 [groups, out], dequantized [out, in]."""
    out_f, in_f = w.shape
    levels = (1 << bits) - 1
    g = w.reshape(out_f, in_f // group, group)
    lo, hi = np.minimum(g.min(axis=-1), 0), np.maximum(g.max(axis=-1), 0)
    s = np.maximum((hi - lo) / levels, 1e-4).astype(np.float16)
    sf = s.astype(np.float32)
    z = np.clip(np.rint(-lo / sf), 1, levels).astype(np.uint32)  # 1..levels: GPTQ stores z − 1
    q = np.clip(np.rint(g / sf[..., None]) + z[..., None], 0, levels).astype(np.uint32)
    deq = (sf[..., None] * (q.astype(np.float32) - z[..., None].astype(np.float32))).reshape(out_f, in_f)
    return q.reshape(out_f, in_f).T.copy(), z.T.copy(), s.T.copy(), deq


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def pack_awq(m):
    """[r, c] 4-bit values → int32 [r, c/8]: value 8j + AWQ_ORDER[n] in nibble n of word j."""
    r, c = m.shape
    blocks = m.reshape(r, c // 8, 8)[:, :, AWQ_ORDER].astype(np.uint32)
    words = np.zeros((r, c // 8), dtype=np.uint32)
    for n in range(8):
        words |= blocks[:, :, n] << np.uint32(4 * n)
    return words.view(np.int32)


def pack_along_rows(m, bits):
    """[r, c] → int32 [r·bits/32, c]: row i in bits (i mod per_word)·bits of word row i / per_word."""
    per = 32 // bits
    r, c = m.shape
    words = np.zeros((r // per, c), dtype=np.uint32)
    for k in range(per):
        words |= m[k::per].astype(np.uint32) << np.uint32(bits * k)
    return words.view(np.int32)


def pack_along_cols(m, bits):
    """[r, c] → int32 [r, c·bits/32]: column j in bits (j mod per_word)·bits of word j / per_word."""
    per = 32 // bits
    r, c = m.shape
    words = np.zeros((r, c // per), dtype=np.uint32)
    for k in range(per):
        words |= m[:, k::per].astype(np.uint32) << np.uint32(bits * k)
    return words.view(np.int32)


# ---- FP8 e4m3 ----

def e4m3_table():
    values = np.zeros(256, dtype=np.float32)
    for b in range(256):
        sign, exp, man = (b >> 7) & 1, (b >> 3) & 0xF, b & 7
        if exp == 0xF and man == 7:
            values[b] = np.nan
            continue
        v = (man / 8.0) * 2.0 ** -6 if exp == 0 else (1 + man / 8.0) * 2.0 ** (exp - 7)
        values[b] = -v if sign else v
    return values


E4M3 = e4m3_table()
E4M3_FINITE = np.array([b for b in range(256) if not np.isnan(E4M3[b])], dtype=np.uint8)


def e4m3_nearest(x):
    """Nearest e4m3 code of each value (ties to the even code), through the sorted finite values."""
    order = np.argsort(E4M3[E4M3_FINITE], kind="stable")
    codes, values = E4M3_FINITE[order], E4M3[E4M3_FINITE][order]
    i = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    left, right = values[i - 1], values[i]
    pick_right = (x - left > right - x) | ((x - left == right - x) & (codes[i] % 2 == 0))
    return np.where(pick_right, codes[i], codes[i - 1]).astype(np.uint8)


def fp8_quantize(w, block):
    """block > 0: a scale per block × block tile; 0: one per output row. Returns codes, scale, bf16 dequantized."""
    out_f, in_f = w.shape
    br, bc = (block, block) if block > 0 else (1, in_f)
    sr, sc = -(-out_f // br), -(-in_f // bc)
    scale = np.zeros((sr, sc), dtype=np.float32)
    for i in range(sr):
        for j in range(sc):
            scale[i, j] = max(np.abs(w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]).max() / 448.0, 1e-12)
    full = np.repeat(np.repeat(scale, br, axis=0), bc, axis=1)[:out_f, :in_f]
    codes = e4m3_nearest(w / full)
    deq = bf16_to_f32(f32_to_bf16(E4M3[codes] * full))
    return codes, scale if block > 0 else scale.reshape(out_f, 1), deq


# ---- one case ----

def is_projection(name):
    return ".layers." in name and name.endswith("_proj.weight")


def expert_names(config):
    if config["model_type"] == "mixtral":
        return "block_sparse_moe", {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    return "mlp", {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}


def mlx_plan(fmt, config):
    """The format's default bits and group, and the modules it gives other bits."""
    if fmt == "mlx-mixed-g64":
        return 4, 64, {"model.layers.0.self_attn.v_proj": 8, "model.layers.1.mlp.gate_proj": 8, "lm_head": 6}
    if fmt == "mlx-3bit-g32":
        return 3, 32, {"model.embed_tokens": 5, "model.layers.0.self_attn.o_proj": 6}
    raise ValueError(fmt)


def write_mlx(fmt, config, tensors):
    bits, group, special = mlx_plan(fmt, config)
    out, dense, quant = {}, {}, {"group_size": group, "bits": bits, "mode": "affine"}
    block, names = expert_names(config)
    n_experts = config.get("num_experts") or config.get("num_local_experts") or 0
    stacked = {}  # layer block → {part: [expert arrays]}
    for name, (dtype, array) in tensors.items():
        if n_experts and ".experts." in name:
            prefix, rest = name.split(".experts.")
            e, part = rest.split(".")[0], rest.split(".")[1]
            stacked.setdefault(prefix, {}).setdefault(part, {})[int(e)] = as_f32(dtype, array)
            continue
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        is_router = n_experts and module is not None and module.endswith(f".{block}.gate")
        b = 8 if is_router else special.get(module, bits)
        if module is None or array.ndim != 2 or array.shape[1] % group != 0 or \
                not (is_projection(name) or is_router or module in ("model.embed_tokens", "lm_head")):
            out[name] = (dtype, array)
            dense[name] = as_f32(dtype, array)
            continue
        codes, s, bi, deq = mlx_quantize(as_f32(dtype, array), b, group)
        out[name], out[module + ".scales"], out[module + ".biases"] = ("U32", codes), ("BF16", s), ("BF16", bi)
        dense[name] = deq
        if b != bits:
            quant[module] = {"group_size": group, "bits": b}
    reverse = {v: k for k, v in names.items()}
    for prefix, parts in stacked.items():
        for part, experts in parts.items():
            w = np.stack([experts[e] for e in range(n_experts)])
            target = f"{prefix}.switch_mlp.{reverse[part]}"
            if w.shape[-1] % group != 0:
                out[target + ".weight"] = ("BF16", f32_to_bf16(w))
                deq = w
            else:
                codes, s, bi, deq = mlx_quantize(w, bits, group)
                out[target + ".weight"], out[target + ".scales"], out[target + ".biases"] = \
                    ("U32", codes), ("BF16", s), ("BF16", bi)
            for e in range(n_experts):
                dense[f"{prefix}.experts.{e}.{part}.weight"] = deq[e]
    return out, dense, {"quantization": quant, "quantization_config": quant}


def write_zero_point(fmt, config, tensors):
    awq = fmt.startswith("awq")
    bits = 8 if "8bit" in fmt else 4
    group = 32
    out, dense = {}, {}
    for name, (dtype, array) in tensors.items():
        w = as_f32(dtype, array)
        if not is_projection(name) or array.shape[1] % group != 0 or array.shape[0] % (32 // bits) != 0:
            out[name], dense[name] = (dtype, array), w
            continue
        module = name[:-len(".weight")]
        q, z, s, deq = zero_point_quantize(w, bits, group)
        if awq:
            out[module + ".qweight"] = ("I32", pack_awq(q))
            out[module + ".qzeros"] = ("I32", pack_awq(z))
        else:
            out[module + ".qweight"] = ("I32", pack_along_rows(q, bits))
            out[module + ".qzeros"] = ("I32", pack_along_cols(z - 1, bits))
            out[module + ".g_idx"] = ("I32", (np.arange(q.shape[0]) // group).astype(np.int32))
        out[module + ".scales"] = ("F16", s)
        dense[name] = deq
    config_keys = {"quant_method": "awq", "bits": bits, "group_size": group, "zero_point": True, "version": "gemm"} \
        if awq else {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": False, "sym": False,
                     "checkpoint_format": "gptq"}
    return out, dense, {"quantization_config": config_keys}


def write_fp8(fmt, config, tensors):
    block = 32 if fmt == "fp8-block32" else 0
    out, dense = {}, {}
    for name, (dtype, array) in tensors.items():
        w = as_f32(dtype, array)
        if not is_projection(name):
            out[name], dense[name] = (dtype, array), w
            continue
        codes, scale, deq = fp8_quantize(w, block)
        module = name[:-len(".weight")]
        out[name] = ("F8_E4M3", codes)
        out[module + (".weight_scale_inv" if block else ".weight_scale")] = ("F32", scale)
        dense[name] = deq
    if block:
        keys = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [block, block]}
    else:
        keys = {"quant_method": "compressed-tensors", "format": "float-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"],
                                              "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
    return out, dense, {"quantization_config": keys}


def make_case(model, fmt, out_root, pack_only):
    src = os.path.join(GOLDENS, model)
    config = json.load(open(os.path.join(src, "model", "config.json")))
    tensors = read_safetensors(os.path.join(src, "model", "model.safetensors"))
    writer = write_mlx if fmt.startswith("mlx") else write_fp8 if fmt.startswith("fp8") else write_zero_point
    packed, dense, keys = writer(fmt, config, tensors)
    case = os.path.join(out_root, f"{model}-{fmt}")
    shutil.rmtree(case, ignore_errors=True)
    os.makedirs(os.path.join(case, "model"))
    write_safetensors(os.path.join(case, "model", "model.safetensors"), packed)
    json.dump({**config, **keys}, open(os.path.join(case, "model", "config.json"), "w"), indent=2)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(src, "model", extra)):
            shutil.copy(os.path.join(src, "model", extra), os.path.join(case, "model", extra))
    golden = json.load(open(os.path.join(src, "golden.json")))
    if pack_only:  # and the dense f32 twin beside it, for a look without transformers
        os.makedirs(os.path.join(case, "dense"))
        write_safetensors(os.path.join(case, "dense", "model.safetensors"),
                          {k: ("F32", v.astype(np.float32)) for k, v in dense.items()})
        json.dump(config, open(os.path.join(case, "dense", "config.json"), "w"), indent=2)
        return case
    logits, greedy, steps, versions = reference(src, config, dense, golden["prompt_ids"])
    logits.astype("<f4").tofile(os.path.join(case, "logits.f32"))
    steps.astype("<f4").tofile(os.path.join(case, "greedy_logits.f32"))
    json.dump({"model_type": config["model_type"], "format": fmt, "prompt_ids": golden["prompt_ids"],
               "logits_shape": list(logits.shape), "logits_file": "logits.f32", "logits_dtype": "float32",
               "greedy_new_tokens": greedy, "greedy_logits_file": "greedy_logits.f32",
               "reference": f"transformers {versions[0]}, torch {versions[1]}: float32 forward on the dequantized "
                            f"weights of tools/quantized-goldens/make.py's {fmt} packing of goldens/{model}"},
              open(os.path.join(case, "golden.json"), "w"), indent=1)
    return case


def reference(src, config, dense, prompt):
    """transformers' float32 forward (on the GPU when there is one, TF32 off, as the float
    goldens were made) of the model with these weights."""
    import torch
    import transformers
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        write_safetensors(os.path.join(tmp, "model.safetensors"), {k: ("F32", v.astype(np.float32)) for k, v in dense.items()})
        json.dump({**config, "dtype": "float32"}, open(os.path.join(tmp, "config.json"), "w"))
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).to(device).eval()
        assert all(p.dtype == torch.float32 for p in model.parameters())
        # The float goldens were taken from the bf16 checkpoint made float32, whose rotary
        # frequencies transformers had computed in bf16 (kettle rounds them to the
        # checkpoint's dtype too): the same here.
        rounded = getattr(torch, config.get("dtype") or config.get("torch_dtype") or "float32")
        for module in model.modules():
            for name, buffer in list(module.named_buffers(recurse=False)):
                if name.endswith("inv_freq"):
                    setattr(module, name, buffer.to(rounded).to(torch.float32))
        with torch.no_grad():
            ids = torch.tensor([prompt], device=device)
            logits = model(ids).logits[0].float().cpu().numpy()
            greedy, steps = [], []
            for _ in range(24):
                last = model(ids).logits[0, -1].float()
                nxt = int(last.argmax())
                greedy.append(nxt)
                steps.append(last.cpu().numpy())
                ids = torch.cat([ids, torch.tensor([[nxt]], device=device)], dim=1)
    return logits, greedy, np.stack(steps), (transformers.__version__, torch.__version__)


def check_reference(model):
    """The reference recipe on the float golden itself: its logits against the stored ones."""
    src = os.path.join(GOLDENS, model)
    config = json.load(open(os.path.join(src, "model", "config.json")))
    tensors = read_safetensors(os.path.join(src, "model", "model.safetensors"))
    golden = json.load(open(os.path.join(src, "golden.json")))
    logits, greedy, _, _ = reference(src, config, {k: as_f32(d, a) for k, (d, a) in tensors.items()}, golden["prompt_ids"])
    stored = np.fromfile(os.path.join(src, golden["logits_file"]), dtype="<f4").reshape(logits.shape)
    err = max(np.linalg.norm(logits[p] - stored[p]) / np.linalg.norm(stored[p]) for p in range(len(stored)))
    print(f"reference recipe on goldens/{model}: worst relative error vs its stored logits {err:.2e}, greedy "
          f"{'equal' if greedy == golden['greedy_new_tokens'] else 'DIFFERS'}", flush=True)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    pack_only = "--pack-only" in sys.argv
    out_root, wanted = args[0], set(args[1:])
    os.makedirs(out_root, exist_ok=True)
    if not pack_only:
        check_reference("llama")
    for model, formats in CASES.items():
        for fmt in formats:
            if wanted and f"{model}-{fmt}" not in wanted:
                continue
            print(make_case(model, fmt, out_root, pack_only), flush=True)


if __name__ == "__main__":
    main()
