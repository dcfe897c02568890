"""``python -m easy_context.plan`` (the ``easy-context-plan`` console script): the parser and :func:`main`."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict

from easy_context.cli import ArgumentParser
from easy_context.core import registry
from easy_context.models.resolve import MODEL_HELP, load_model_shape
from easy_context.models.shapes import parse_size
from easy_context.plan.options import OPTION_BY_NAME, OPTIONS, parse_config
from easy_context.plan.report import format_breakdown, format_header, format_run, format_summary, train_flags
from easy_context.plan.setup import LOSS_CHUNK, NORMS, OPTIMS, Setup, mode_layout
from easy_context.plan.solve import ROUND_TOKENS, budget_at, plan, predict
from easy_context.plan.validate import anchors, format_anchors, format_validation, read_probes, validate_probe


def build_parser() -> ArgumentParser:
    """The parser of ``python -m easy_context.plan`` (:func:`main`)."""
    ap = ArgumentParser(
        prog="python -m easy_context.plan",
        description="Predict the byte budget and longest trainable context per SP mode and memory option.",
        epilog="Assumptions and validation: see docs/planner.md.",
    )
    ap.add_argument("--model", help=MODEL_HELP + " (its config only)")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs in all (nodes x GPUs per node)")
    ap.add_argument("--gpu-mem", default="80GB", help="per GPU: 80GB (1e9), 80GiB (2^30), 141GB")
    ap.add_argument("--host-mem", default="1TB", help="per node")
    ap.add_argument("--gpus-per-node", type=int, default=None, help="default min(gpus, 8)")
    modes = registry.SEQ_ALGOS
    ap.add_argument("--sp", nargs="+", default=list(modes), choices=modes, metavar="MODE", help=f"{modes}")
    ap.add_argument("--sp-size", type=int, default=None, help="SP group size W (default all GPUs)")
    registry.add_option_args(ap)  # each backend's options (usp_attn's --ring-degree); default: searched
    ap.add_argument("--optim", default="zero3_offload", choices=OPTIMS, help="optimizer state placement")
    ap.add_argument(
        "--options",
        nargs="+",
        default=[o.name for o in OPTIONS],
        choices=[o.name for o in OPTIONS],
        help="memory options to compare",
    )
    ap.add_argument("--mlp-tiles", default="auto", help="tiled MLP tile count, or 'auto' (tiles of h tokens)")
    ap.add_argument("--mlp-tile-tokens", type=int, default=None, help="tiled MLP tiles of this many tokens (8192)")
    ap.add_argument("--loss-chunk", type=int, default=LOSS_CHUNK, help="tokens per chunk of the chunked LM-head loss")
    ap.add_argument(
        "--norm",
        choices=NORMS,
        default=None,
        help="RMSNorm autograd: eager (transformers', the default) or chunked (enable_chunked_rmsnorm); "
        "--validate: default the probe's own",
    )
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=1,
        metavar="K",
        help="keep every K-th layer input, regenerate the others (as train.py --checkpoint-every)",
    )
    ap.add_argument(
        "--attn-heads-per-call",
        type=int,
        default=None,
        metavar="N",
        help="at most N query heads per attention kernel call (as train.py --attn-heads-per-call)",
    )
    ap.add_argument("--vocab-size", type=int, default=None, help="override the vocab (presets default to 32000)")
    ap.add_argument("--frag", type=float, default=0.10, help="allocator fragmentation overhead (0.10 = 10%%)")
    ap.add_argument("--cuda-reserve", default="1.5GB", help="CUDA context and runtime per GPU")
    ap.add_argument("--host-reserve", default="3GB", help="host runtime per process")
    ap.add_argument("--no-pinned-pow2", action="store_true", help="pinned blocks not rounded to powers of two")
    ap.add_argument("--seq", type=int, default=None, help="S for the breakdown (default: max of the best option)")
    ap.add_argument(
        "--offload-layers",
        type=int,
        default=None,
        help="offload-split breakdown: layer inputs on the host (default: as many as the host holds)",
    )
    ap.add_argument(
        "--show", default=None, metavar="MODE:CONFIG", help="breakdown for e.g. zigzag_ring_attn:offload+tiled"
    )
    ap.add_argument("--anchors", action="store_true", help="also print the published anchors vs predictions")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument(
        "--validate",
        metavar="JSONL",
        default=None,
        help="compare with the measured probes of a bench/max_context.py --out file (and exit)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    """Print the plan (or, ``--validate``, the check against probes); 0 on success, argparse errors exit 2."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.validate:
        overrides = dict(
            frag=args.frag,
            cuda_reserve=parse_size(args.cuda_reserve),
            host_reserve=parse_size(args.host_reserve),
            pinned_pow2=not args.no_pinned_pow2,
            norm=args.norm,
        )
        checks = [validate_probe(r, **overrides) for r in read_probes(args.validate)]
        if args.json:
            json.dump(checks, sys.stdout, indent=2)
            print()
        else:
            print(format_validation(checks))
        return 0
    if not args.model:
        ap.error("--model is required")

    try:
        shape = load_model_shape(args.model, args.vocab_size)
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    if args.mlp_tiles != "auto" and args.mlp_tile_tokens:
        ap.error("give --mlp-tiles or --mlp-tile-tokens, not both")
    setup = Setup(
        gpus=args.gpus,
        gpu_mem=parse_size(args.gpu_mem),
        host_mem=parse_size(args.host_mem),
        gpus_per_node=args.gpus_per_node,
        sp_size=args.sp_size,
        optim=args.optim,
        mlp_tiles=None if args.mlp_tiles == "auto" else int(args.mlp_tiles),
        mlp_tile_tokens=args.mlp_tile_tokens,
        loss_chunk=args.loss_chunk,
        frag=args.frag,
        cuda_reserve=parse_size(args.cuda_reserve),
        host_reserve=parse_size(args.host_reserve),
        pinned_pow2=not args.no_pinned_pow2,
        norm=args.norm or "eager",
        checkpoint_every=args.checkpoint_every,
        attn_heads_per_call=args.attn_heads_per_call,
        **{k: v for k, v in registry.option_values(args).items() if k in Setup.__dataclass_fields__},
    )
    options = [OPTION_BY_NAME[o] for o in args.options]
    preds = plan(shape, setup, args.sp, options)
    if args.show:  # a mode and a concrete configuration (e.g. zigzag_ring_attn:offload+tiled)
        mode, _, cfg = args.show.partition(":")
        if mode not in registry.SEQ_ALGOS:
            ap.error(f"--show: unknown mode {mode!r}")
        chosen = predict(shape, setup, mode, parse_config(cfg or "offload+tiled+chunked"))
    else:  # the longest prediction (the first registered mode on ties)
        chosen = max(preds, key=lambda p: (p.max_seq, -registry.SEQ_ALGOS.index(p.mode)))
    seq = args.seq if args.seq is not None else chosen.max_seq
    if seq <= 0:
        seq = math.lcm(mode_layout(chosen.mode, shape, setup).multiple, ROUND_TOKENS)
    budget = budget_at(shape, setup, chosen.mode, parse_config(chosen.config), seq, args.offload_layers)
    flags = train_flags(shape, setup, chosen.mode, chosen.config, seq, budget)

    if args.json:
        r = budget.at(seq)
        out = dict(
            model=dict(asdict(shape), params=shape.params, layer_params=shape.layer_params),
            setup=asdict(setup),
            predictions=[asdict(p) for p in preds],
            breakdown=dict(mode=chosen.mode, config=chosen.config, seq=seq, local_tokens=r["local_tokens"],
                           offload_layers=r["offload_layers"], peak_phase=r["peak_phase"],
                           phase_totals=r["phase_totals"], gpu={n: b for n, b in r["gpu"]},
                           gpu_allocated=r["gpu_allocated"], gpu_total=r["gpu_total"],
                           host={n: b for n, b in r["host"]}, host_peak_phase=r["host_peak_phase"],
                           host_phase_totals=r["host_phase_totals"], host_total=r["host_total"],
                           train_flags=flags),
        )  # fmt: skip
        if args.anchors:
            out["anchors"] = anchors()
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0

    print(format_header(shape, setup))
    print()
    print(format_breakdown(shape, setup, budget, seq))
    print(format_run(setup, flags))
    print()
    print(format_summary(preds, setup))
    if args.anchors:
        print()
        print(format_anchors(anchors()))
    return 0
