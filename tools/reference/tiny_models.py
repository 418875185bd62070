"""Write fixtures/tiny/<family>/: tiny random HF checkpoints + their exact fp32 reference outputs.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python tools/reference/tiny_models.py
      (TINY_FAMILIES=llama,gemma3 to restrict; ~1 min on 2 cores)

For each family a structurally real but tiny model (hidden 64, 2-3 layers, 4 query heads / 2 KV heads,
vocab 256) is built with transformers from a fixed torch seed, in fp32, and saved with `save_pretrained`
(config.json + model.safetensors + generation_config.json). Besides the transformers initialisation
(normal(0, initializer_range) for matrices/embeddings), every RMSNorm weight and every bias is then set to
random values too (norm weights ~ 1 + 0.3*N(0,1); for Gemma3, whose norms compute x*(1+w), 0.3*N(0,1),
except its post-attention / post-feedforward norms: 5 + 0.3*N(0,1));
biases ~ 0.2*N(0,1)), so that a wrong norm formula or a dropped bias changes the logits. gpt-oss: its expert biases
(`*_bias`) are biases too, its attention sinks ~ 1.5*N(0,1), and its experts' gate_up_proj is scaled by 3 so that
the clamped SwiGLU's limits (gate above 7, up outside ±7) take effect.

The saved checkpoint is reloaded with `from_pretrained(dir, attn_implementation="eager", dtype=float32)`
and `reference.json` records, for the fixed `input_ids`:
  logits_f32_hex   the fp32 logits `model(input_ids).logits[0]` at every position, one string per position:
                   vocab_size values, each the 8 hex digits of its IEEE-754 f32 bit pattern (u32, most
                   significant digit first: 3f800000 = 1.0), concatenated.  Bit-exact.
  argmax           per-position argmax of those logits
  greedy           8 greedy tokens after input_ids: argmax of the full (no KV cache) forward over the
                   growing sequence, no logits processors, no stop on EOS; checked equal to
                   `model.generate(do_sample=False, max_new_tokens=8)` with the KV cache.
  config_v4_style  the same config written the transformers-4 way (rope_theta / rope_scaling /
                   rope_local_base_freq instead of transformers-5's rope_parameters); transformers 5 turns it
                   back into the same rope_parameters (checked), so a config.json loader can be tested on both.
Deterministic: a second run gives byte-identical files (same torch/transformers versions).
"""

import hashlib
import json
import os
import sys
import time
from importlib.metadata import version

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    Gemma3ForCausalLM, Gemma3TextConfig, GenerationConfig, GptOssConfig, GptOssForCausalLM, LlamaConfig, LlamaForCausalLM,
    MistralConfig, MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
    Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM,
)

from common import FIXTURES_DIR  # noqa: E402

torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "1")))

SEED = 1234
# Fixed prompt: 24 ids in [0, 256), with repeats and both ends of the vocab.
INPUT_IDS = [2, 17, 203, 44, 5, 99, 250, 128, 7, 64, 64, 64, 31, 200, 3, 150, 88, 12, 255, 0, 42, 42, 101, 77]
N_GREEDY = 8

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.2,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)

# family -> (model class, config class, config kwargs (new style), v4-style rope keys)
FAMILIES = {
    "llama": (LlamaForCausalLM, LlamaConfig, dict(
        COMMON, intermediate_size=128, num_hidden_layers=2, head_dim=16, rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
    ), {"rope_theta": 50000.0}),
    "llama3": (LlamaForCausalLM, LlamaConfig, dict(
        COMMON, intermediate_size=96, num_hidden_layers=2, head_dim=16, rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    ), {"rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32}}),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, dict(
        COMMON, intermediate_size=160, num_hidden_layers=2, rms_norm_eps=1e-6,  # head_dim = 64/4 = 16
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ), {"rope_theta": 1000000.0}),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, dict(
        COMMON, intermediate_size=96, num_hidden_layers=3, head_dim=16, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
    ), {"rope_theta": 5000.0}),
    # Mistral: llama attention with a sliding window (8) shorter than the 24-token prompt, on every layer.
    "mistral": (MistralForCausalLM, MistralConfig, dict(
        COMMON, intermediate_size=112, num_hidden_layers=2, head_dim=16, rms_norm_eps=1e-5,
        tie_word_embeddings=False, sliding_window=8,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ), {"rope_theta": 1000000.0}),
    # Mixture of experts: 8 experts, 2 per token. Qwen3-MoE with a dense layer between two sparse ones
    # (mlp_only_layers) and normalized top-k weights (as Qwen3-30B-A3B); Mixtral (llama attention, experts under
    # block_sparse_moe, top-k softmax).
    "qwen3moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig, dict(
        COMMON, intermediate_size=96, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], num_hidden_layers=3, head_dim=16,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
    ), {"rope_theta": 5000.0}),
    "mixtral": (MixtralForCausalLM, MixtralConfig, dict(
        COMMON, intermediate_size=48, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
        head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
    ), {"rope_theta": 20000.0}),
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig, dict(
        COMMON, intermediate_size=128, num_hidden_layers=2, head_dim=32, rms_norm_eps=1e-6,
        tie_word_embeddings=True, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        hidden_activation="gelu_pytorch_tanh",
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 100000.0}},
    ), {"rope_theta": 100000.0, "rope_local_base_freq": 10000.0}),
    # gpt-oss: attention sinks, q/k/v/o biases, sliding (window 4) and full layers alternating, YaRN RoPE (factor
    # 4 over an original context of 32, untruncated ramp as openai/gpt-oss-20b), a router with a bias and a softmax
    # over its top-k logits, experts with biases and the clamped SwiGLU (alpha 1.702, limit 7).
    "gpt_oss": (GptOssForCausalLM, GptOssConfig, dict(
        COMMON, intermediate_size=48, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=3,
        head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=4, attention_bias=True,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32},
    ), {"rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 32}}),
}


def f32_hex(row):
    a = np.ascontiguousarray(row, dtype=np.float32).view(np.uint32)
    return "".join(f"{int(x):08x}" for x in a)


def perturb(model, family):
    """Randomise norm weights and biases (deterministic, seeded separately from the init)."""
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                noise = 0.3 * torch.randn(p.shape, generator=g, dtype=torch.float32)
                if family != "gemma3":
                    p.copy_(1.0 + noise)
                elif ".post_" in name:
                    # Gemma3's sandwich norms: scale the attention / MLP outputs up (x * (1 + w), 1 + w ~ 6), so
                    # the residual stream is not dominated by the (sqrt(hidden)-scaled) token embedding, whose
                    # tied output row would otherwise make every position predict its own input token.
                    p.copy_(5.0 + noise)
                else:
                    p.copy_(noise)
            elif name.endswith((".bias", "_bias")):
                p.copy_(0.2 * torch.randn(p.shape, generator=g, dtype=torch.float32))
            elif name.endswith("experts.gate_up_proj"):
                # gpt-oss: gate and up values of several units, so that the SwiGLU's clamps at ±7 take effect.
                p.mul_(3.0)
            elif name.endswith(".sinks"):
                # gpt-oss attention sinks: per-head logits of the size of the attention scores.
                p.copy_(1.5 * torch.randn(p.shape, generator=g, dtype=torch.float32))


def variant_logits(m, ids, cfg_changes=None, state_fn=None, out=None):
    """Logits of a modified copy of the model (for the `sensitivity` table)."""
    import copy
    cfg = copy.deepcopy(m.config)
    for k, v in (cfg_changes or {}).items():
        setattr(cfg, k, v)
    v = type(m)(cfg).to(torch.float32).eval()
    v.load_state_dict(m.state_dict())
    if state_fn:
        with torch.no_grad():
            state_fn(v)
    with torch.no_grad():
        return v(ids).logits[0].float().numpy()


def sensitivity(family, m, out, ids, logits):
    """Max |logit difference| caused by plausible implementation mistakes, so that tests can pick a
    tolerance well below them (and know the fixture really exercises the feature)."""
    res = {}

    def rec(name, other, from_pos=0):
        res[name] = round(float(np.abs(other[from_pos:] - logits[from_pos:]).max()), 6)

    def zero(suffix):
        def fn(v):
            for n, p in v.named_parameters():
                if n.endswith(suffix):
                    p.zero_()
        return fn

    def scale_norms(delta):
        def fn(v):
            for n, p in v.named_parameters():
                if n.endswith("norm.weight"):
                    p.add_(delta)
        return fn

    rp = m.config.rope_parameters
    if family == "llama3":
        rec("rope_scaling_ignored", variant_logits(m, ids, {"rope_parameters": {"rope_type": "default",
                                                                                "rope_theta": rp["rope_theta"]}}))
    if family == "qwen2":
        rec("qkv_bias_dropped", variant_logits(m, ids, state_fn=zero(".bias")))
    if family == "qwen3":
        rec("qk_norm_weights_ignored(=1)", variant_logits(m, ids, state_fn=lambda v: [
            p.fill_(1.0) for n, p in v.named_parameters() if n.endswith(("q_norm.weight", "k_norm.weight"))]))
    if family == "gpt_oss":
        rec("sinks_dropped", variant_logits(m, ids, state_fn=lambda v: [
            p.fill_(-1e30) for n, p in v.named_parameters() if n.endswith(".sinks")]))
        rec("rope_scaling_ignored", variant_logits(m, ids, {"rope_parameters": {"rope_type": "default",
                                                                                "rope_theta": rp["rope_theta"]}}))
        rec("sliding_window_ignored(positions>=4)", variant_logits(
            m, ids, {"layer_types": ["full_attention"] * m.config.num_hidden_layers}), from_pos=4)
        rec("swiglu_limit_ignored", variant_logits(m, ids, {"swiglu_limit": 1e30}))
    if family == "mistral":
        rec("sliding_window_ignored(positions>=8)", variant_logits(m, ids, {"sliding_window": None}), from_pos=8)
    if family == "gemma3":
        rec("norm_without_plus_one", variant_logits(m, ids, state_fn=scale_norms(-1.0)))
        rec("sliding_window_ignored(positions>=8)", variant_logits(
            m, ids, {"layer_types": ["full_attention"] * m.config.num_hidden_layers}), from_pos=8)
        rec("query_pre_attn_scalar_as_head_dim", variant_logits(m, ids, {"query_pre_attn_scalar": m.config.head_dim}))
        swapped = {"full_attention": rp["sliding_attention"], "sliding_attention": rp["full_attention"]}
        rec("local_global_rope_theta_swapped", variant_logits(m, ids, {"rope_parameters": swapped}))
        rec("embedding_not_scaled_by_sqrt_hidden", variant_logits(m, ids, state_fn=lambda v: v.model.embed_tokens.
                                                                  __setattr__("embed_scale", torch.tensor(1.0))))
    else:
        theta = rp["rope_theta"]
        rec("rope_theta_10000" if theta != 10000.0 else "rope_theta_500000",
            variant_logits(m, ids, {"rope_parameters": dict(rp, rope_theta=10000.0 if theta != 10000.0 else 500000.0)}))
    return res


def file_sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def make(family):
    t0 = time.time()
    model_cls, cfg_cls, kwargs, v4_rope = FAMILIES[family]
    out = FIXTURES_DIR / "tiny" / family
    out.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        f.unlink()

    cfg = cfg_cls(**kwargs)
    torch.manual_seed(SEED)
    model = model_cls(cfg).to(torch.float32).eval()
    perturb(model, family)
    model.save_pretrained(out)

    # v4-style config (rope_theta/rope_scaling/rope_local_base_freq) must map to the same rope_parameters.
    saved_cfg = json.loads((out / "config.json").read_text())
    v4 = {k: v for k, v in saved_cfg.items() if k != "rope_parameters"}
    v4.update(json.loads(json.dumps(v4_rope)))
    v4 = json.loads(json.dumps(v4))  # own copy: config classes mutate the rope dicts they are given
    v4_cfg = cfg_cls(**{k: v for k, v in json.loads(json.dumps(v4)).items()
                        if k not in ("architectures", "model_type", "transformers_version")})
    assert v4_cfg.rope_parameters == model.config.rope_parameters, (v4_cfg.rope_parameters, model.config.rope_parameters)

    m = model_cls.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    sd0, sd1 = model.state_dict(), m.state_dict()
    for k in sd0:
        assert torch.equal(sd0[k], sd1[k]), k
    n_params = sum(p.numel() for p in m.parameters())

    ids = torch.tensor([INPUT_IDS])
    with torch.no_grad():
        logits = m(ids).logits[0].float().numpy()
        seq = list(INPUT_IDS)
        for _ in range(N_GREEDY):
            nxt = int(torch.argmax(m(torch.tensor([seq])).logits[0, -1]))
            seq.append(nxt)
        greedy = seq[len(INPUT_IDS):]
        gc = GenerationConfig(do_sample=False, max_new_tokens=N_GREEDY, min_new_tokens=0, eos_token_id=None,
                              pad_token_id=0, bos_token_id=None)
        gen = m.generate(ids, generation_config=gc, attention_mask=torch.ones_like(ids))[0, len(INPUT_IDS):].tolist()
    assert gen == greedy, (family, gen, greedy)

    sens = sensitivity(family, m, out, ids, logits)

    srt = np.sort(logits, axis=-1)
    ref = {
        "family": family,
        "model_class": model_cls.__name__,
        "config_class": cfg_cls.__name__,
        "seed": SEED,
        "n_params": n_params,
        "transformers": version("transformers"),
        "torch": version("torch"),
        "attn_implementation": "eager",
        "files_sha256": {f.name: file_sha(f) for f in sorted(out.iterdir())},
        "config_v4_style": v4,
        "input_ids": INPUT_IDS,
        "vocab_size": int(logits.shape[1]),
        "argmax": [int(x) for x in logits.argmax(-1)],
        "top1_margin": [round(float(a - b), 6) for a, b in zip(srt[:, -1], srt[:, -2])],
        "logits_abs_max": round(float(np.abs(logits).max()), 6),
        "logits_std": round(float(logits.std()), 6),
        "greedy": greedy,
        "sensitivity": sens,
        "greedy_method": "argmax of full forward over the growing sequence, 8 steps, no EOS stop; "
                         "equals generate(do_sample=False) with KV cache",
        "logits_encoding": "per position: vocab_size x 8 hex digits, each the u32 bit pattern of an f32 "
                           "(most significant digit first), concatenated",
    }
    lines = ["{"]
    parts = [f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in ref.items()]
    parts.append('  "logits_f32_hex": [\n' + ",\n".join(f'    "{f32_hex(r)}"' for r in logits) + "\n  ]")
    lines.append(",\n".join(parts))
    lines.append("}")
    text = "\n".join(lines) + "\n"
    back = json.loads(text)
    # round-trip check of the encoding
    dec = np.array([[int(h[i:i + 8], 16) for i in range(0, len(h), 8)] for h in back["logits_f32_hex"]],
                   dtype=np.uint32).view(np.float32)
    assert np.array_equal(dec, logits)
    (out / "reference.json").write_text(text)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"{family}: {n_params} params, {size / 1024:.1f} KiB, logits std {logits.std():.3f}, "
          f"argmax {ref['argmax'][:6]}..., greedy {greedy}, {time.time() - t0:.1f}s", flush=True)


def main():
    want = os.environ.get("TINY_FAMILIES")
    fams = [f.strip() for f in want.split(",")] if want else list(FAMILIES)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}")
    for f in fams:
        make(f)


if __name__ == "__main__":
    main()
