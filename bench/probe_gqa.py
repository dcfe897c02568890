"""Which CUDA aten attention ops accept un-repeated GQA K/V (one-off probe)."""
import torch

aten = torch.ops.aten
q = torch.randn(1, 8, 256, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16)
for name, call in {
    "cudnn": lambda: aten._scaled_dot_product_cudnn_attention(q, k, k, None, True, 0.0, True, False),
    "flash": lambda: aten._scaled_dot_product_flash_attention(q, k, k, 0.0, True, False),
    "efficient": lambda: aten._scaled_dot_product_efficient_attention(q, k, k, None, True, 0.0, True),
}.items():
    try:
        res = call()
        print(name, "GQA ok", [tuple(r.shape) if torch.is_tensor(r) else r for r in res[:2]])
    except Exception as e:
        print(name, "GQA fails:", str(e).splitlines()[0][:200])
