#!/usr/bin/env python3
"""verify_hf_export.py: checks a directory written by `hgrn export --format hf` against fla's own model of its type
(HGRN2ForCausalLM for model_type "hgrn2", HGRNForCausalLM for "hgrn", GLAForCausalLM for "gla", RetNetForCausalLM
for "retnet").

Usage:
    hgrn export --checkpoint runs/x/checkpoints/step_00001000.h5 --format hf --out exports/x --reference-logits 4
    python3 tools/verify_hf_export.py exports/x [--device cuda|cpu] [--tolerance 1e-3]

What it checks, in order (exit status 0 only if all pass):
  1. The weights, read with the plain `safetensors` package (model.safetensors, or the shards that
     model.safetensors.index.json names), have exactly the state-dict names and shapes that config.json implies for
     fla's model of that type (hgrn-spec.md section 5.3 for HGRN2).
  2. `import fla` (which registers fla's models with transformers' Auto classes), then
     AutoModelForCausalLM.from_pretrained(dir, torch_dtype=float32) loads the directory with no missing, unexpected
     or mismatched weights.
  3. fla's forward on the input_ids of hgrn_reference.safetensors (written by --reference-logits) reproduces hgrn's
     logits: it prints the max absolute error, the max relative error (max|fla - hgrn| / max|hgrn|) and the relative
     RMS error (rms(fla - hgrn) / rms(hgrn)), and fails when the relative RMS error exceeds the tolerance.

Needs torch, transformers, safetensors and flash-linear-attention (`pip install flash-linear-attention`). fla's
kernels are written in Triton, so the forward needs a CUDA GPU; it runs there when one is available.
"""

import argparse
import json
import math
import os
import sys

# Both sides compute in fp32, so an exact port differs only by rounding. fla's Triton kernels and cuBLAS may use
# TF32 (10-bit mantissa) for fp32 products in places, and fla reduces in a different order than hgrn; that is worth
# up to ~1e-4 relative RMS on these small models. A real mismatch (a wrong scale, a transposed weight, the g_norm eps
# of hgrn-spec.md section 1.2 step 7, which is 1e-5 inside fla's fused norm + o_proj and which hgrn follows, or a
# lower bound applied to the wrong layer) shows up as 1e-2 or more. 1e-3 separates the two.
DEFAULT_TOLERANCE = 1e-3

REFERENCE_FILE = "hgrn_reference.safetensors"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


# fla's GLAConfig and RetNetConfig defaults for num_heads, expand_k and expand_v.
HEAD_DEFAULTS = {"gla": (4, 0.5, 1.0), "retnet": (8, 1.0, 2.0)}
GLA_GATE_LOW_RANK_DIM = 16  # GatedLinearAttention's gate_low_rank_dim, which GLAConfig does not expose
MODEL_TYPES = ("hgrn2", "hgrn", "gla", "retnet")


def mixer_shapes(config):
    """The token mixer's tensors (below model.layers.N.attn.) and the lower bounds' width (None: no lower bounds),
    by model_type."""
    d = config["hidden_size"]
    if config["model_type"] in HEAD_DEFAULTS:
        default_heads, default_k, default_v = HEAD_DEFAULTS[config["model_type"]]
        heads = config.get("num_heads", default_heads)
        keys = round(d * config.get("expand_k", default_k))
        values = round(d * config.get("expand_v", default_v))
        shapes = {"q_proj.weight": (keys, d), "k_proj.weight": (keys, d), "v_proj.weight": (values, d),
                  "g_proj.weight": (values, d)}
        if config["model_type"] == "gla":
            rank = GLA_GATE_LOW_RANK_DIM
            shapes.update({"gk_proj.0.weight": (rank, d), "gk_proj.1.weight": (keys, rank), "gk_proj.1.bias": (keys,)})
        shapes.update({"o_proj.weight": (d, values), "g_norm_swish_gate.weight": (values // heads,)})
        return shapes, None
    if config["model_type"] == "hgrn":
        width = d * config.get("expand_ratio", 1)
        return {"i_proj.weight": (width, d), "f_proj.weight": (width, d), "g_proj.weight": (width, d),
                "g_norm.weight": (width,), "o_proj.weight": (d, width)}, width
    expand_ratio = config.get("expand_ratio", 128)
    num_heads = config.get("num_heads")
    if expand_ratio is None:
        expand_ratio = d // num_heads
    forget_dim = (d // expand_ratio) * expand_ratio
    return {"q_proj.weight": (forget_dim, d), "f_proj.weight": (forget_dim, d), "i_proj.weight": (d, d),
            "g_norm.weight": (d,), "o_proj.weight": (d, d)}, d


def expected_state_dict(config):
    """Names and shapes of fla's *ForCausalLM state dict for this config.json (use_short_conv False)."""
    d = config["hidden_size"]
    layers = config["num_hidden_layers"]
    vocab = config["vocab_size"]
    mixer, gate_width = mixer_shapes(config)
    intermediate = config.get("intermediate_size")
    if intermediate is None:
        ratio = config.get("hidden_ratio") or 4
        intermediate = 256 * math.ceil(int(d * ratio * 2 / 3) / 256)
    shapes = {"model.embeddings.weight": (vocab, d)}
    if gate_width is not None and config.get("use_lower_bound", True):
        shapes["model.lower_bounds"] = (layers, gate_width)
    for layer in range(layers):
        p = f"model.layers.{layer}."
        shapes[p + "attn_norm.weight"] = (d,)
        for name, shape in mixer.items():
            shapes[p + "attn." + name] = shape
        shapes[p + "mlp_norm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (intermediate, d)
        shapes[p + "mlp.up_proj.weight"] = (intermediate, d)
        shapes[p + "mlp.down_proj.weight"] = (d, intermediate)
    shapes["model.norm.weight"] = (d,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, d)
    return shapes


def weight_files(export_dir):
    if os.path.exists(os.path.join(export_dir, SINGLE_FILE)):
        return [SINGLE_FILE]
    index_path = os.path.join(export_dir, INDEX_FILE)
    if not os.path.exists(index_path):
        sys.exit(f"{export_dir}: neither {SINGLE_FILE} nor {INDEX_FILE} is there")
    with open(index_path) as f:
        index = json.load(f)
    return sorted(set(index["weight_map"].values()))


def check_names_and_shapes(export_dir, config):
    from safetensors import safe_open

    found = {}
    for file_name in weight_files(export_dir):
        with safe_open(os.path.join(export_dir, file_name), framework="numpy") as f:
            metadata = f.metadata() or {}
            if metadata.get("format") != "pt":
                print(f"FAIL {file_name}: metadata format is {metadata.get('format')!r}; transformers wants 'pt'")
                return False
            for name in f.keys():
                if name in found:
                    print(f"FAIL tensor {name} appears in two files")
                    return False
                found[name] = tuple(f.get_slice(name).get_shape())
    expected = expected_state_dict(config)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    wrong = sorted(n for n in set(expected) & set(found) if expected[n] != found[n])
    for name in missing:
        print(f"FAIL missing tensor {name} {expected[name]}")
    for name in extra:
        print(f"FAIL unexpected tensor {name} {found[name]}")
    for name in wrong:
        print(f"FAIL tensor {name} has shape {found[name]}, config.json implies {expected[name]}")
    ok = not (missing or extra or wrong)
    if ok:
        print(f"ok   safetensors: {len(found)} tensors with the names and shapes config.json implies")
    return ok


def load_with_fla(export_dir, device):
    import torch
    import transformers

    import fla  # noqa: F401  (registers fla's configs and models with the Auto classes)
    from transformers import AutoModelForCausalLM

    # transformers 5 renamed torch_dtype to dtype.
    major = int(transformers.__version__.split(".")[0])
    dtype_argument = {"dtype": torch.float32} if major >= 5 else {"torch_dtype": torch.float32}
    model, info = AutoModelForCausalLM.from_pretrained(export_dir, output_loading_info=True, **dtype_argument)
    problems = {key: list(info.get(key) or []) for key in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(problems.values()):
        for key, names in problems.items():
            if names:
                print(f"FAIL from_pretrained: {key}: {names}")
        return None
    print(f"ok   transformers {transformers.__version__} + fla loaded {type(model).__name__} "
          f"({sum(p.numel() for p in model.parameters())} parameters) with no missing or unexpected weights")
    return model.to(device).eval()


def compare_logits(model, export_dir, device, tolerance):
    import torch
    from safetensors.torch import load_file

    reference_path = os.path.join(export_dir, REFERENCE_FILE)
    if not os.path.exists(reference_path):
        print(f"FAIL {reference_path} is missing: export with --reference-logits N")
        return False
    reference = load_file(reference_path)
    input_ids = reference["input_ids"].to(device)
    expected = reference["logits"].double()
    # Keep PyTorch's own fp32 matrix products exact fp32; what remains is fla's kernels (see DEFAULT_TOLERANCE).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        logits = model(input_ids=input_ids, use_cache=False).logits.double().cpu()
    if logits.shape != expected.shape:
        print(f"FAIL fla's logits have shape {tuple(logits.shape)}, hgrn's {tuple(expected.shape)}")
        return False
    diff = logits - expected
    max_abs = diff.abs().max().item()
    max_rel = max_abs / expected.abs().max().item()
    rel_rms = diff.pow(2).mean().sqrt().item() / expected.pow(2).mean().sqrt().item()
    ok = rel_rms <= tolerance
    print(f"{'ok  ' if ok else 'FAIL'} logits on {input_ids.shape[0]} x {input_ids.shape[1]} tokens ({device}): "
          f"max abs error {max_abs:.3e}, max relative error {max_rel:.3e}, relative RMS error {rel_rms:.3e} "
          f"(tolerance {tolerance:.0e})")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export_dir", help="directory written by hgrn export --format hf")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help="largest relative RMS error of the logits that passes (default %(default)s)")
    args = parser.parse_args()

    with open(os.path.join(args.export_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") not in MODEL_TYPES:
        sys.exit(f"{args.export_dir}/config.json: model_type is {config.get('model_type')!r}, "
                 f"expected one of {', '.join(repr(t) for t in MODEL_TYPES)}")

    ok = check_names_and_shapes(args.export_dir, config)

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        print("note: no CUDA device; fla's Triton kernels may not run on the CPU")
    model = load_with_fla(args.export_dir, device)
    ok = model is not None and ok
    if model is not None:
        ok = compare_logits(model, args.export_dir, device, args.tolerance) and ok
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
