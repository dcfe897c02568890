"""Find how to call aten::_scaled_dot_product_cudnn_attention_backward from Python (one-off probe)."""
import torch

aten = torch.ops.aten
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, 8, 256, 128, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(1, 8, 256, 128, device="cuda", dtype=torch.bfloat16, generator=g)
v = torch.randn(1, 8, 256, 128, device="cuda", dtype=torch.bfloat16, generator=g)
do = torch.randn_like(q)
res = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False)
out, lse, csq, csk, mq, mk, seed, off, dbg = res
print("fwd aux:", [(type(x).__name__, getattr(x, "shape", x), getattr(x, "dtype", None)) for x in (csq, csk, mq, mk, seed, off)])
qr, kr, vr = (x.detach().float().requires_grad_() for x in (q, k, v))
ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
ref.backward(do.float())
E = lambda: torch.empty(0, device="cuda")  # noqa: E731
for label, bias, s1, s2, c1, c2 in [
    ("None bias, fwd aux", None, seed, off, csq, csk),
    ("empty bias, fwd aux", E(), seed, off, csq, csk),
    ("None bias, empty aux", None, E(), E(), E(), E()),
]:
    try:
        dq, dk, dv = aten._scaled_dot_product_cudnn_attention_backward(do, q, k, v, out, lse, s1, s2, bias, c1, c2, mq, mk, 0.0, True, scale=None)
        err = max(((a.float() - b).abs().max() / b.abs().max()).item() for a, b in zip((dq, dk, dv), (qr.grad, kr.grad, vr.grad)))
        print(label, "OK err", err)
    except Exception as e:
        print(label, "FAIL", type(e).__name__, str(e).splitlines()[0][:150])
