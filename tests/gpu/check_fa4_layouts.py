"""GPU check of kernel ``fa4`` on the layouts transformers hands it; a switched Gemma 3 against its own attention.

transformers' attention functions receive q/k/v as (batch, heads, seq, head_dim) and easy_context transposes them to
(batch, seq, heads, head_dim) *views*: the head stride is seq * head_dim, not head_dim. The fa4 parity checks
(bench/fa4_check.py) use contiguous tensors. This checks, on one CUDA GPU in bf16 against the fp32 math reference:

- fa4 forward and backward on contiguous and on transposed-view inputs, Gemma 3's shape (4q/1kv, head_dim 256),
  full causal and a sliding-window band (0, 511);
- a random-init model of Gemma-3-270M's config (18 layers, window 512, 4q/1kv, head_dim 256) at 2048 tokens: logits
  and loss switched to ``kernel="fa4"`` (one process) against the model's own SDPA attention.

Exit status 0 only when every required check passes. Not collected by pytest (CPU CI has no GPU)::

    python tests/gpu/check_fa4_layouts.py [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from easy_context.kernels.fa4 import FA4  # noqa: E402
from easy_context.kernels.math_ref import MATH  # noqa: E402
from tests.gpu.report import Report, rel  # noqa: E402

DEV = "cuda"
TOL = 2e-2  # bf16, relative to the largest reference entry
REPORT = Report()
record = REPORT.record
GEMMA3_270M = dict(
    model_type="gemma3_text", hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, sliding_window=512, query_pre_attn_scalar=256, vocab_size=262144,
    max_position_embeddings=32768, rope_parameters={"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                                                    "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}},
)  # fmt: skip


def as_transformers_view(x: torch.Tensor) -> torch.Tensor:
    """The same values as (batch, seq, heads, dim), laid out as transformers' (batch, heads, seq, dim) transposed."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def check_layouts() -> None:
    g = torch.Generator(device=DEV).manual_seed(0)
    for s, hq, hkv, d in ((2048, 4, 1, 256),):
        q, dout = (torch.randn(1, s, hq, d, device=DEV, generator=g, dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(1, s, hkv, d, device=DEV, generator=g, dtype=torch.bfloat16) for _ in range(2))
        scale = d**-0.5
        for band in (None, (0, 511)):
            f32 = [x.float() for x in (q, k, v, dout)]
            r_out, r_lse = MATH.forward(*f32[:3], True, scale, band)
            r_grads = MATH.backward(f32[3], *f32[:3], r_out, r_lse, True, scale, band)
            for layout in ("contiguous", "transposed_view"):
                qq, kk, vv, dd = (as_transformers_view(x) if layout != "contiguous" else x for x in (q, k, v, dout))
                out, lse = FA4.forward(qq, kk, vv, True, scale, band)
                grads = FA4.backward(dd, qq, kk, vv, out, lse, True, scale, band)
                errs = {"out": rel(out, r_out), "lse": (lse - r_lse).abs().max().item()}
                errs.update({n: rel(gr, r) for n, gr, r in zip(("dq", "dk", "dv"), grads, r_grads)})
                ok = max(errs["out"], errs["dq"], errs["dk"], errs["dv"]) < TOL and errs["lse"] < TOL
                record(f"fa4/{layout}/s{s}/h{hq}-{hkv}/d{d}/band{band}", ok, **errs)
            # flash-attn-4 itself on the transposed views (informational: what the adapter's copy protects from)
            from flash_attn.cute import flash_attn_func

            left = None if band is None else band[1]
            views = [as_transformers_view(x) for x in (q, k, v)]
            raw = flash_attn_func(*views, softmax_scale=scale, causal=True, window_size=(left, 0 if band else None))
            raw = raw[0] if isinstance(raw, tuple) else raw
            record(f"raw_flash_attn_func/transposed_view/s{s}/h{hq}-{hkv}/d{d}/band{band}", True, required=False,
                   out=rel(raw, r_out))  # fmt: skip


def check_gemma() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from easy_context import apply_seq_parallel_monkey_patch

    config = AutoConfig.for_model(**GEMMA3_270M)
    torch.manual_seed(0)
    own, ours = (  # a config each: switching a model sets its config's attention implementation
        AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
        .to(DEV, torch.bfloat16)
        .eval()
        for _ in range(2)
    )
    ours.load_state_dict(own.state_dict())
    apply_seq_parallel_monkey_patch("data_parallel", ours, kernel="fa4")
    ids = torch.randint(0, config.vocab_size, (1, 2048), device=DEV, generator=torch.Generator(DEV).manual_seed(1))
    with torch.no_grad():
        a, b = own(ids, labels=ids), ours(ids, labels=ids)
    err, dloss = rel(b.logits, a.logits), abs(b.loss.item() - a.loss.item())
    record("gemma3_270m_config/2048/fa4_vs_sdpa", err < 5e-2 and dloss < 2e-2, logits=err, loss_own=a.loss.item(),
           loss_fa4=b.loss.item())  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("check_fa4_layouts.py needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    return REPORT.run({"layouts": check_layouts, "gemma": check_gemma}, args.json)


if __name__ == "__main__":
    sys.exit(main())
