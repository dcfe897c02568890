"""The ``fa4`` kernel (FlashAttention-4) on CPU: dispatch, error paths, and the adapter's argument mapping.

The numerics of the real kernel are checked on the GPU (``bench/fa4_check.py``). Here a *fake* flash-attn-4 package
(written to a temporary directory: ``flash_attn/cute`` only, the namespace layout of the real wheel) implements
``flash_attn_func`` / ``interface._flash_attn_bwd`` with the semantics read from flash-attn-4 4.0.0b36 -- bottom-right
aligned windows ``i + (s_k - s_q) - left <= j <= i + (s_k - s_q) + right``, ``causal`` setting ``right = 0``, soft-cap
``cap * tanh(s * scale / cap)``, a natural-log (b, h, s) float32 LSE -- in explicit fp32 math, so the adapter's band ->
window mapping, argument names, LSE handling and GQA are checked end to end against the ``math`` kernel.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
import textwrap
import warnings

import pytest
import torch

import easy_context.kernels as kernels
from easy_context.backends.zigzag_ring_attn import zigzag_shard
from easy_context.backends.zigzag_ring_attn.attention import step_blocks
from easy_context.core.blockwise import ForwardAccumulator, backward_blocks, forward_blocks
from easy_context.kernels import KERNELS, get_kernel, kernel_works, kernels_supporting
from easy_context.kernels import fa4 as fa4mod
from easy_context.kernels.base import allowed_keys
from easy_context.kernels.flash_attn_pkg import flash_attn_available
from easy_context.kernels.math_ref import MATH, math_forward

FAKE_FA4 = """
import torch

CALLS = []


def _resolve(causal, left, right):  # flash-attn-4's _resolve_causal_local_window (no mask_mod)
    if left is not None and right is not None and left < 0 and right < 0:
        left = right = None
    if causal:
        right = 0
    return left, right


def _mask(sq, sk, causal, left, right):
    left, right = _resolve(causal, left, right)
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None]
    off = sk - sq
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if right is not None:
        ok &= j <= i + off + right
    if left is not None:
        ok &= j >= i + off - left
    return ok


def _scores(q, k, scale, causal, left, right, softcap):
    rep = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float().repeat_interleave(rep, 2)) * scale
    t = None
    if softcap:
        t = torch.tanh(s / softcap)
        s = softcap * t
    return s.masked_fill(~_mask(q.shape[1], k.shape[1], causal, left, right), float("-inf")), t


def _flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=None, causal=False, softcap=0.0, window_size_left=None,
                    window_size_right=None, m_block_size=64, n_block_size=128, deterministic=False, dq=None, dk=None,
                    dv=None, score_mod=None, score_mod_bwd=None, mask_mod=None, dlse=None, learnable_sink=None):
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1]), lse.shape
    assert q.dtype == k.dtype == v.dtype == out.dtype == dout.dtype and q.dtype in (torch.float16, torch.bfloat16)
    CALLS.append(("bwd", dict(causal=causal, left=window_size_left, right=window_size_right, softcap=softcap,
                              contiguous=all(t.is_contiguous() for t in (q, k, v, out, dout)))))
    s, t = _scores(q, k, softmax_scale, causal, window_size_left, window_size_right, softcap)
    p = torch.exp(s - lse.unsqueeze(-1))
    rep = q.shape[2] // k.shape[2]
    do = dout.float()
    dv_ = torch.einsum("bhqk,bqhd->bkhd", p, do)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, v.float().repeat_interleave(rep, 2))
    delta = (do * out.float()).sum(-1).transpose(1, 2).unsqueeze(-1)
    ds = p * (dp - delta) * softmax_scale
    if t is not None:
        ds = ds * (1 - t * t)
    dq_ = torch.einsum("bhqk,bkhd->bqhd", ds, k.float().repeat_interleave(rep, 2))
    dk_ = torch.einsum("bhqk,bqhd->bkhd", ds, q.float())
    b, sk, hkv, d = k.shape
    dk_ = dk_.view(b, sk, hkv, rep, d).sum(3)
    dv_ = dv_.view(b, sk, hkv, rep, d).sum(3)
    return dq_.to(q.dtype), dk_.to(k.dtype), dv_.to(v.dtype)


def flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                    window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                    deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                    aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False,
                    gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
    assert q.dtype in (torch.float16, torch.bfloat16)
    CALLS.append(("fwd", dict(causal=causal, left=window_size[0], right=window_size[1], softcap=softcap,
                              contiguous=all(t.is_contiguous() for t in (q, k, v)))))
    s, _ = _scores(q, k, softmax_scale, causal, window_size[0], window_size[1], softcap)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1))
    rep = q.shape[2] // k.shape[2]
    out = torch.einsum("bhqk,bkhd->bqhd", p, v.float().repeat_interleave(rep, 2)).to(q.dtype)
    return out, lse
"""


def _write(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    """Install fake ``flash_attn`` packages under tmp_path (call with a {path: text} dict); restores sys.modules
    and the cached FA4 import check afterwards."""
    saved = {n: m for n, m in sys.modules.items() if n == "flash_attn" or n.startswith("flash_attn.")}

    def clear():
        for n in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
            del sys.modules[n]
        fa4mod.fa4_import_error.cache_clear()
        importlib.invalidate_caches()

    def install(files: dict[str, str]):
        _write(tmp_path, files)
        monkeypatch.syspath_prepend(str(tmp_path))
        clear()

    yield install
    clear()
    sys.modules.update(saved)


FA4_ONLY = {"flash_attn/cute/__init__.py": "from .interface import flash_attn_func\n",
            "flash_attn/cute/interface.py": FAKE_FA4}  # fmt: skip
FA2_ONLY = {"flash_attn/__init__.py": "def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, "
                                      "return_attn_probs=False):\n    raise NotImplementedError\n"}  # fmt: skip


@pytest.fixture
def fake_fa4(fake_site):
    fake_site(FA4_ONLY)
    from flash_attn.cute import interface

    interface.CALLS.clear()
    return interface


def _rand(*shape, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)).item()


# --- dispatch and errors -------------------------------------------------------------------------------------------
def test_fa4_is_registered_with_its_variants():
    assert "fa4" in kernels.KERNEL_NAMES and KERNELS["fa4"] is fa4mod.FA4
    assert "fa4" in kernels_supporting("softcap") and "fa4" in kernels_supporting("band")
    assert kernels_supporting("softcap")[0] == "math"  # the kernel that runs anywhere is named first
    assert not fa4mod.FA4.expands_kv  # native GQA: K/V are never repeated
    assert fa4mod.FA4.with_softcap(30.0).softcap == 30.0
    assert kernels.CUDA_PREFERENCE[:2] == ("fa4", "cudnn")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_auto_on_cpu_never_picks_fa4(dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        picked = {get_kernel("auto", "cpu", dtype, d, needs).name for d in (64, 128) for needs in
                  ((), ("softcap",), ("band",), ("softcap", "band"))}  # fmt: skip
    assert "fa4" not in picked and picked <= {"cpu", "math"}


def test_explicit_fa4_on_cpu_says_it_needs_a_gpu(monkeypatch):
    def no_probe(*a):
        raise AssertionError("fa4 must be refused on CPU without a probe call (no compilation)")

    monkeypatch.setattr(kernels, "_probe", no_probe)
    monkeypatch.setattr(kernels, "_PROBED", {})
    with pytest.raises(RuntimeError, match=r"'fa4' cannot run here: it needs a CUDA GPU of compute capability 9\.x"):
        get_kernel("fa4", "cpu", torch.bfloat16, 128)
    assert not kernel_works("fa4", "cpu", torch.bfloat16, 64)


def _fake_cuda(monkeypatch, capability=(9, 0)):
    """Make kernel_works treat "cuda" as a probe-able device on this CPU machine (probes succeed)."""
    probes = []
    monkeypatch.setattr(kernels, "_PROBED", {})
    monkeypatch.setattr(kernels, "_PROBE_ERRORS", {})
    monkeypatch.setattr(kernels, "_device_key", lambda device: device.type if device.type != "cuda" else "cuda:0 X")
    monkeypatch.setattr(kernels, "_probe", lambda kern, dev, dtype, d: probes.append((kern.name, dtype, d)) or True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    return probes


def test_explicit_fa4_without_the_package_names_the_pip_package(monkeypatch, fake_site):
    _fake_cuda(monkeypatch)
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # `import flash_attn...` raises ImportError
    fa4mod.fa4_import_error.cache_clear()
    with pytest.raises(RuntimeError, match=r"not importable .*`pip install flash-attn-4` \(or `pip install "
                                           r"easy_context\[gpu\]`\)"):  # fmt: skip
        get_kernel("fa4", "cuda", torch.bfloat16, 128)
    assert get_kernel("auto", "cuda", torch.bfloat16, 128).name == "cudnn"  # auto moves on to the next one


def test_auto_prefers_fa4_on_sm90_and_sm100_only(monkeypatch, fake_fa4):
    for capability, want in (((9, 0), "fa4"), ((10, 0), "fa4"), ((8, 0), "cudnn"), ((12, 0), "cudnn")):
        probes = _fake_cuda(monkeypatch, capability)
        assert get_kernel("auto", "cuda", torch.bfloat16, 128).name == want, capability
        assert ("fa4" in {p[0] for p in probes}) == (want == "fa4")  # refused without a probe (no compilation)
    _fake_cuda(monkeypatch, (9, 0))
    assert get_kernel("auto", "cuda", torch.bfloat16, 128, ("softcap", "band")).name == "fa4"
    assert get_kernel("auto", "cuda", torch.float32, 128).name == "cudnn"  # fp32: not fa4
    with pytest.raises(RuntimeError, match="bfloat16 and float16 only"):
        get_kernel("fa4", "cuda", torch.float32, 128)
    with pytest.raises(RuntimeError, match="head_dim 8-256 in multiples of 8, not 100"):
        get_kernel("fa4", "cuda", torch.bfloat16, 100)
    _fake_cuda(monkeypatch, (10, 0))
    with pytest.raises(RuntimeError, match="head_dim 8-128 or 256"):
        get_kernel("fa4", "cuda", torch.bfloat16, 192)
    assert get_kernel("fa4", "cuda", torch.bfloat16, 256).name == "fa4"
    with pytest.raises(RuntimeError, match=r"compute capability 9\.x or 10\.x .*this GPU is compute capability 8\.6"):
        _fake_cuda(monkeypatch, (8, 6))
        get_kernel("fa4", "cuda", torch.bfloat16, 128)


def test_fa4_probe_runs_once_per_device_dtype_and_head_dim(monkeypatch, fake_fa4):
    probes = _fake_cuda(monkeypatch)
    for _ in range(3):
        for d in (64, 128):
            assert kernel_works("fa4", "cuda", torch.bfloat16, d)
    assert probes == [("fa4", torch.bfloat16, 64), ("fa4", torch.bfloat16, 128)]


def test_a_failed_fa4_probe_is_shown(monkeypatch, fake_fa4):
    _fake_cuda(monkeypatch)

    def failing(*a):
        raise RuntimeError("DSL compile error XYZ")

    monkeypatch.setattr(kernels, "_probe", failing)
    with pytest.raises(RuntimeError, match="its probe call failed .*DSL compile error XYZ"):
        get_kernel("fa4", "cuda", torch.bfloat16, 128)


# --- the flash_attn namespace: FA2 and FA4 are told apart -----------------------------------------------------------
def test_fa4_only_install_is_not_taken_for_flash_attn_2(fake_site):
    fake_site(FA4_ONLY)
    assert flash_attn_available()  # `import flash_attn` succeeds: a namespace package holding only cute/
    assert not kernels._flash_attn2_available()  # ...but it is not FlashAttention-2
    assert fa4mod.fa4_import_error() is None and fa4mod.fa4_available()
    assert "flash-attn package is not importable" in kernels._static_reason("flash_attn", torch.device("cuda"),
                                                                            torch.bfloat16, 128)  # fmt: skip


def test_fa2_only_install_is_not_taken_for_fa4(fake_site):
    fake_site(FA2_ONLY)
    assert kernels._flash_attn2_available()
    assert not fa4mod.fa4_available() and "flash_attn.cute" in fa4mod.fa4_import_error()


def test_a_flash_attn_cute_without_this_api_is_refused(fake_site):
    """An older ``flash_attn/cute`` (e.g. one shipped inside a flash-attn 2 install) lacking return_lse."""
    fake_site({**FA2_ONLY, "flash_attn/cute/__init__.py": "from .interface import flash_attn_func\n",
               "flash_attn/cute/interface.py": "def flash_attn_func(q, k, v, softmax_scale=None, causal=False):\n"
                                               "    pass\n"})  # fmt: skip
    err = fa4mod.fa4_import_error()
    assert err.startswith("unsupported flash-attn-4 version") and "return_lse" in err and "_flash_attn_bwd" in err


# --- pure helpers ----------------------------------------------------------------------------------------------------
def test_to_natural_lse_matches_the_math_kernel():
    q, k, v = _rand(2, 24, 4, 16, seed=1), _rand(2, 40, 2, 16, seed=2), _rand(2, 40, 2, 16, seed=3)
    _, lse = math_forward(q, k, v, False, 0.25)
    assert torch.equal(fa4mod.to_natural_lse(lse, 2, 4, 24), lse)
    back = fa4mod.to_natural_lse(lse / math.log(2.0), 2, 4, 24, log2=True)  # a base-2 LSE would be converted
    assert back.dtype == torch.float32 and torch.allclose(back, lse, rtol=1e-6, atol=1e-6)
    assert fa4mod.to_natural_lse(lse.half(), 2, 4, 24).dtype == torch.float32
    with pytest.raises(RuntimeError, match=r"expected \(2, 4, 24\) \(batch, heads, seq\)"):
        fa4mod.to_natural_lse(lse.transpose(1, 2), 2, 4, 24)


_FAKE: dict = {}
exec(FAKE_FA4, _FAKE)


def _fa4_mask(sq, sk, causal, left, right):
    """flash-attn-4's mask (the fake package's, i.e. block_info.py / mask.py semantics)."""
    return _FAKE["_mask"](sq, sk, causal, left, right)


def _bands(sq, sk):
    g = torch.Generator().manual_seed(sq * 1000 + sk)
    out = [(0, 0), (0, sq - 1), (-(sk - 1), 0), (-(sk - 1), sq - 1), (3, 7), (-5, 2), (-(sk - 2), -(sk - 4))]
    for _ in range(30):
        a, b = sorted(torch.randint(-(sk - 1), sq, (2,), generator=g).tolist())
        out.append((a, b))
    return out


@pytest.mark.parametrize("sq,sk", [(16, 16), (12, 40), (40, 12), (1, 9), (33, 1), (64, 64)])
def test_band_window_is_exact_for_square_and_rectangular_blocks(sq, sk):
    """Every band (lo, hi) maps to a flash-attn-4 window whose mask equals ours, causal too (square blocks)."""
    for causal in (False, True) if sq == sk else (False,):
        assert fa4mod.band_window(None, sq, sk, causal) == (causal, None, None)
        assert torch.equal(
            _fa4_mask(sq, sk, causal, None, None),
            allowed_keys(sq, sk, causal, None, "cpu") if causal else torch.ones(sq, sk, dtype=bool),
        )
        for band in _bands(sq, sk):
            if causal and band[1] < 0:
                continue  # no key at all
            fa_causal, left, right = fa4mod.band_window(band, sq, sk, causal)
            assert not fa_causal and left is not None and right is not None  # one compiled kernel for all bands
            want = allowed_keys(sq, sk, causal, band, "cpu")
            assert torch.equal(_fa4_mask(sq, sk, fa_causal, left, right), want), (band, causal, left, right)
    with pytest.raises(ValueError, match="empty band"):
        fa4mod.band_window((3, 2), sq, sk, False)


def test_band_window_is_exact_on_the_blocks_the_backends_make():
    """The band blocks zigzag makes for sliding windows (every step of 1-4 ranks, several windows), as computed."""
    seen = 0
    for world in (1, 2, 3, 4):
        s_local = 2 * 24
        q = torch.zeros(1, s_local, 1, 8)
        for window in (1, 5, 20, 33, 70):
            for rank in range(world):
                for src in range(world):
                    for blk in step_blocks(rank, src, world, q, True, None, window):
                        if blk.band is None:
                            continue
                        sq = blk.q_rows.stop - blk.q_rows.start
                        sk = blk.k_rows.stop - blk.k_rows.start
                        fa_causal, left, right = fa4mod.band_window(blk.band, sq, sk, blk.causal)
                        want = allowed_keys(sq, sk, blk.causal, blk.band, "cpu")
                        assert torch.equal(_fa4_mask(sq, sk, fa_causal, left, right), want)
                        seen += 1
    assert seen > 50


# --- the adapter end to end through the fake package ----------------------------------------------------------------
CASES = [  # (sq, sk, hq, hkv, d, causal, softcap, band)
    (48, 48, 4, 4, 16, True, None, None),
    (48, 48, 8, 2, 16, False, None, None),
    (32, 80, 8, 2, 32, False, None, None),  # a rectangular ring block
    (48, 48, 4, 1, 16, True, 30.0, None),
    (40, 56, 4, 2, 16, False, 5.0, (-20, 10)),
    (48, 48, 4, 2, 16, True, None, (0, 9)),  # a diagonal tile cut by a window
    (24, 64, 2, 2, 16, False, None, (-50, -30)),  # keys after the queries only
    (24, 64, 2, 2, 16, False, None, (-10, 5)),  # window_size_right < 0
    (64, 24, 2, 2, 16, False, None, (-5, 45)),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_fa4_adapter_matches_the_math_kernel(fake_fa4, case):
    sq, sk, hq, hkv, d, causal, softcap, band = case
    q, dout = _rand(2, sq, hq, d, seed=1), _rand(2, sq, hq, d, seed=2)
    k, v = _rand(2, sk, hkv, d, seed=3), _rand(2, sk, hkv, d, seed=4)
    q_view = torch.cat([q, q], dim=2)[:, :, :hq]  # non-contiguous input
    ours, ref = fa4mod.FA4.with_softcap(softcap), MATH.with_softcap(softcap)
    out, lse = ours.forward(q_view, k, v, causal, d**-0.5, band)
    want_out, want_lse = ref.forward(q, k, v, causal, d**-0.5, band)
    assert lse.dtype == torch.float32 and lse.shape == (2, hq, sq) and out.shape == q.shape
    assert rel_err(out, want_out) < 1e-2 and (lse - want_lse).abs().max() < 1e-4
    grads = ours.backward(dout, q_view, k, v, out, lse, causal, d**-0.5, band)
    want = ref.backward(dout, q, k, v, want_out, want_lse, causal, d**-0.5, band)
    for got, exp, t in zip(grads, want, (q, k, v)):
        assert got.shape == t.shape and got.dtype == t.dtype and rel_err(got, exp) < 2e-2
    fwd, bwd = fake_fa4.CALLS
    assert fwd[0] == "fwd" and bwd[0] == "bwd" and fwd[1] == bwd[1]  # one mapping for both directions
    assert fwd[1]["softcap"] == (softcap or 0.0)
    assert fwd[1]["causal"] == (causal and band is None)


def test_fa4_adapter_through_a_windowed_zigzag_schedule(fake_fa4):
    """Zigzag on 3 virtual ranks with an 11-token window: every block (full, causal, banded) through the adapter
    equals the same schedule through the math kernel, forward and backward."""
    world, s, hq, hkv, d, window = 3, 6 * 16, 4, 2, 16, 11
    q, dout = _rand(1, s, hq, d, seed=5), _rand(1, s, hq, d, seed=6)
    k, v = _rand(1, s, hkv, d, seed=7), _rand(1, s, hkv, d, seed=8)
    qs, ks, vs, ds = ([zigzag_shard(x, r, world) for r in range(world)] for x in (q, k, v, dout))
    results = {}
    for kern in (fa4mod.FA4, MATH):
        accs = [ForwardAccumulator(x) for x in qs]
        for r in range(world):
            for src in range(world):
                forward_blocks(kern, qs[r], ks[src], vs[src], step_blocks(r, src, world, qs[r], True, None, window),
                               d**-0.5, accs[r])  # fmt: skip
        outs, lses = zip(*(acc.result(x.dtype) for acc, x in zip(accs, qs)))
        dq = [torch.zeros(x.shape) for x in qs]
        for r in range(world):
            for src in range(world):
                backward_blocks(kern, ds[r], qs[r], ks[src], vs[src], outs[r], lses[r],
                                step_blocks(r, src, world, qs[r], True, None, window), d**-0.5, dq[r])  # fmt: skip
        results[kern.name] = (torch.cat(outs, 1), torch.cat(lses, 2), torch.cat(dq, 1))
    bands = [c for c in fake_fa4.CALLS if c[1]["left"] is not None]
    assert bands, "the window made band blocks"
    for got, want in zip(results["fa4"], results["math"]):
        assert rel_err(got, want) < 2e-2


def test_fa4_gets_contiguous_tensors_from_transformers_views(fake_fa4):
    """transformers' (b, h, s, d) tensors reach the kernel as transposed (b, s, h, d) views; flash-attn-4 kernels have
    read such views as contiguous (head_dim 256), so the adapter hands it contiguous copies: same values, same math."""
    view = lambda x: x.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
    q, dout = _rand(1, 96, 4, 32, seed=1), _rand(1, 96, 4, 32, seed=2)
    k, v = _rand(1, 96, 1, 32, seed=3), _rand(1, 96, 1, 32, seed=4)
    args = [view(x) for x in (q, k, v)]
    assert not args[0].is_contiguous()
    out, lse = KERNELS["fa4"].forward(*args, True, 32**-0.5, (0, 15))
    grads = KERNELS["fa4"].backward(view(dout), *args, view(out), lse, True, 32**-0.5, (0, 15))
    assert [c[1]["contiguous"] for c in fake_fa4.CALLS] == [True, True]
    r_out, r_lse = MATH.forward(q.float(), k.float(), v.float(), True, 32**-0.5, (0, 15))
    r_grads = MATH.backward(dout.float(), q.float(), k.float(), v.float(), r_out, r_lse, True, 32**-0.5, (0, 15))
    assert rel_err(out, r_out) < 2e-2
    assert all(rel_err(g, r) < 3e-2 for g, r in zip(grads, r_grads))


def test_first_call_of_a_configuration_says_it_compiles(fake_fa4, capsys, monkeypatch):
    monkeypatch.setattr(fa4mod, "COMPILE_SECONDS", {})
    q, k = _rand(1, 16, 4, 16, seed=1), _rand(1, 16, 2, 16, seed=2)
    for _ in range(3):
        fa4mod.FA4.forward(q, k, k, True, 0.25)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["easy_context: flash-attn-4 compiles its forward kernel (bfloat16, head_dim 16, causal, GQA 2:1) "
                     "on first use (once per process; can take tens of seconds)"]  # fmt: skip
    fa4mod.FA4.with_softcap(30.0).forward(q, k, k, False, 0.25, band=(-3, 4))
    assert "(bfloat16, head_dim 16, non-causal, GQA 2:1, softcap 30, band)" in capsys.readouterr().err
    assert set(fa4mod.COMPILE_SECONDS) == {("forward", "bfloat16", 16, 2, True, None, False),
                                           ("forward", "bfloat16", 16, 2, False, 30.0, True)}  # fmt: skip
    assert all(t >= 0 for t in fa4mod.COMPILE_SECONDS.values())


def test_fa4_refuses_fp32_tensors_clearly():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(TypeError, match="'fa4' computes bfloat16 and float16 only, got torch.float32"):
        fa4mod.FA4.forward(q, q, q, True, 0.25)
    with pytest.raises(TypeError, match="bfloat16 and float16 only"):
        fa4mod.FA4.backward(q, q, q, q, q, torch.zeros(1, 2, 8), True, 0.25)


HEAD_DIMS = [(9, 8, True), (9, 256, True), (9, 264, False), (9, 60, False), (10, 128, True), (10, 192, False),
             (10, 256, True), (10, 4, False)]  # fmt: skip


@pytest.mark.parametrize("major,d,ok", HEAD_DIMS)
def test_head_dim_limits(major, d, ok):
    assert fa4mod.head_dim_supported(major, d) is ok
