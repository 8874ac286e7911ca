"""peer_models.py: the peer's model for a shape: a freshly initialised fla model of the config every peer tool uses
(peer_bench.py, peer_generate_bench.py, peer_parity.py): fla's defaults, its fused norm, SwiGLU and cross entropy,
HGRN2 with expand_ratio 128 and HGRN1 with expand_ratio 1 (fla's config names)."""


def fla_model(model_type, layers, hidden, vocab):
    """A freshly initialised fla model (on the CPU, fp32) of model_type: hgrn2, hgrn, gla or retnet."""
    import fla.models as m
    fused = dict(hidden_size=hidden, num_hidden_layers=layers, vocab_size=vocab, fuse_cross_entropy=True,
                 fuse_norm=True, fuse_swiglu=True)
    if model_type == "hgrn2":
        return m.HGRN2ForCausalLM(m.HGRN2Config(expand_ratio=128, **fused))
    if model_type == "hgrn":
        return m.HGRNForCausalLM(m.HGRNConfig(expand_ratio=1, **fused))
    if model_type == "gla":
        return m.GLAForCausalLM(m.GLAConfig(**fused))
    if model_type == "retnet":
        return m.RetNetForCausalLM(m.RetNetConfig(**fused))
    raise ValueError(f"unknown model type {model_type!r} (expected hgrn2, hgrn, gla or retnet)")
