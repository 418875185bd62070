"""Write fixtures/tiny/nemotron_h/: a tiny random Nemotron-H (Mamba-2 + attention + squared-ReLU MLP layers)
checkpoint and its exact fp32 reference outputs, in the format of tiny_models.py (reference.json: input_ids,
logits_f32_hex per position, argmax, greedy).

Run:  HF_HUB_OFFLINE=1 .venv/bin/python tools/reference/tiny_hybrid.py

Layers "M*-M-": Mamba-2 mixer, attention (no positional encoding, as Nemotron-H), MLP, Mamba-2, MLP. Mamba-2:
4 heads of 16 channels, 2 B/C groups, state size 8, convolution kernel 4 with a bias, chunk size 8 (so the
transformers chunked scan crosses chunks on the 24-token prompt). Besides the transformers initialisation, every
norm weight (1 + 0.3 N(0,1)), A_log, D, dt_bias and the convolution bias are randomised, so a wrong formula
changes the logits. The greedy continuation is the argmax of the full (no cache) forward over the growing
sequence and is checked equal to generate() with the recurrent cache.
"""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from importlib.metadata import version  # noqa: E402
from transformers import GenerationConfig, NemotronHConfig, NemotronHForCausalLM  # noqa: E402

from common import FIXTURES_DIR  # noqa: E402

torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "1")))

SEED = 1234
INPUT_IDS = [2, 17, 203, 44, 5, 99, 250, 128, 7, 64, 64, 64, 31, 200, 3, 150, 88, 12, 255, 0, 42, 42, 101, 77]
N_GREEDY = 8


def f32_hex(row):
    a = np.ascontiguousarray(row, dtype=np.float32).view(np.uint32)
    return "".join(f"{int(x):08x}" for x in a)


def main():
    out = FIXTURES_DIR / "tiny" / "nemotron_h"
    out.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        f.unlink()
    cfg = NemotronHConfig(
        vocab_size=256, hidden_size=64, hybrid_override_pattern="M*-M-", num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=96, mlp_hidden_act="relu2", mamba_num_heads=4,
        mamba_head_dim=16, n_groups=2, ssm_state_size=8, conv_kernel=4, chunk_size=8, use_conv_bias=True,
        use_bias=False, mlp_bias=False, layer_norm_epsilon=1e-5, time_step_min=0.001, initializer_range=0.2,
        max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=2, eos_token_id=1, pad_token_id=0,
        residual_in_fp32=False, rescale_prenorm_residual=False,
    )
    torch.manual_seed(SEED)
    model = NemotronHForCausalLM(cfg).to(torch.float32).eval()
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 4 + 0.5))
            elif name.endswith(".D"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) - 1.0)
            elif name.endswith("conv1d.bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    m = NemotronHForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    ids = torch.tensor([INPUT_IDS])
    with torch.no_grad():
        logits = m(ids).logits[0].float().numpy()
        seq = list(INPUT_IDS)
        for _ in range(N_GREEDY):
            seq.append(int(torch.argmax(m(torch.tensor([seq])).logits[0, -1])))
        greedy = seq[len(INPUT_IDS):]
        gc = GenerationConfig(do_sample=False, max_new_tokens=N_GREEDY, min_new_tokens=0, eos_token_id=None,
                              pad_token_id=0, bos_token_id=None)
        gen = m.generate(ids, generation_config=gc, attention_mask=torch.ones_like(ids))[0, len(INPUT_IDS):].tolist()
    assert gen == greedy, (gen, greedy)
    srt = np.sort(logits, axis=-1)
    ref = {
        "family": "nemotron_h",
        "model_class": "NemotronHForCausalLM",
        "seed": SEED,
        "transformers": version("transformers"),
        "torch": version("torch"),
        "input_ids": INPUT_IDS,
        "vocab_size": int(logits.shape[1]),
        "argmax": [int(x) for x in logits.argmax(-1)],
        "top1_margin": [round(float(a - b), 6) for a, b in zip(srt[:, -1], srt[:, -2])],
        "greedy": greedy,
        "logits_f32_hex": [f32_hex(r) for r in logits],
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print("wrote", out, "params", sum(p.numel() for p in m.parameters()), "greedy", greedy)


if __name__ == "__main__":
    main()
