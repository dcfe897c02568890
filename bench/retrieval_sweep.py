"""Retrieval emergence at the CPU demo's batch (16 rows of 256 tokens) and the extension after it.

Rows come from the library (``easy_context.data.needles.retrieval_row``), prompts from the eval
(``easy_context.tasks.needle.make_case``); a plain loop (HF Llama, AdamW, bf16 autocast on CUDA) trains a base model,
reports teacher-forced retrieval at haystacks 64/128/192 every 250 steps, and, once it retrieves (>= 0.8), extends it
(RoPE base raised, rows of 2048 tokens) and reports retrieval at 384/768/1536. Each configuration runs as its own
process (8 side by side fit one H200); results go to $OUT/<name>.log. The sweeps of docs/benchmarks.md ("Third
session", 2026-12-01, one H200) are the lists in bench/retrieval_sweep.json:

    OUT=out/sweep python bench/retrieval_sweep.py bench/retrieval_sweep.json sweep4

(sweep1-3 drew their data order from Python's per-process hash seed, so they repeat only in distribution; sweep4-5
use fixed data seeds.) Keys of a configuration: g (digit groups), v (vocab), dig (needle digits), kmax (needles per
document), frac (needle rows), aw (answer-token weight), copy (share of plain rows with a repeated span), lr, bs, L,
h / nl / nh / kv (model), seed, steps, budget (seconds), ext_steps / ext_L / ext_bs / ext_lr / theta (extension).
"""

import json
import math
import os
import random
import subprocess
import sys
import time
import zlib

import numpy as np
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
from easy_context.data.needles import NeedleMix, retrieval_row
from easy_context.eval.scoring import answer_split
from easy_context.tasks.haystack import Haystack, read_haystack_text
from easy_context.tasks.needle import make_case

OUT = os.environ.get("OUT", "/tmp/out")
PG = os.environ.get("ESSAYS", os.path.join(ROOT, "PaulGrahamEssays"))


def tokdir(g, v):
    return f"/tmp/tok_g{g}_v{v}"


_W = {}


def _init(g, v):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokdir(g, v))
    text = read_haystack_text(PG)
    _W.update(
        tok=tok,
        hay=Haystack.from_text(text, tok),
        stream=np.array(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64),
    )


def make_rows(a):
    seed, n, L, kmax, dig, frac, copy = a
    rng = random.Random(seed)
    tok, hay, stream = _W["tok"], _W["hay"], _W["stream"]
    mix = NeedleMix(frac, dig, kmax, "answer")
    rows = np.zeros((n, L + 1), dtype=np.int64)
    tr = np.ones((n, L + 1), dtype=bool)
    for i in range(n):
        if rng.random() < frac:
            rows[i], tr[i] = retrieval_row(rng, hay, tok, L + 1, stream, mix)
        else:
            s = rng.randrange(len(stream) - L - 2)
            rows[i] = stream[s : s + L + 1]
            if rng.random() < copy:  # a span followed by itself: every token of the copy is an induction target
                m = rng.randint(8, (L + 1) // 2)
                at = rng.randint(0, L + 1 - 2 * m)
                rows[i, at + m : at + 2 * m] = rows[i, at : at + m]
    return rows, tr


def evaluate(model, tok, hay, lengths, n, dig, dev):
    model.eval()
    res = {}
    lp = {}
    with torch.no_grad():
        for length in lengths:
            ok = 0
            tot = 0.0
            for s in range(n):
                case = make_case(hay, length, [0, 25, 50, 75, 100][s % 5], s, dig, 0, 123)
                ids, st = answer_split(tok, case.prompt, case.answer)
                x = torch.tensor([ids[:-1]], device=dev)
                with torch.autocast("cuda", torch.bfloat16, enabled=dev == "cuda"):
                    lg = model(x, use_cache=False).logits[0, st - 1 :].float()
                tgt = torch.tensor(ids[st:], device=dev)
                ok += int((lg.argmax(-1) == tgt).all())
                tot += float(torch.log_softmax(lg, -1).gather(1, tgt[:, None]).sum())
            res[length] = round(ok / n, 2)
            lp[length] = round(tot / n, 1)
    model.train()
    return res, lp


def train(model, opt, sched, pool, cfg, L, bs, steps, frac, p, dev, tag, evalfn, t0, stop):
    aw = cfg.get("aw", 1.0)
    chunk = 1000
    it = pool.imap(
        make_rows,
        [
            (
                zlib.crc32(f"{tag}:{cfg.get('seed', 0)}:{i}".encode()),
                chunk,
                L,
                cfg.get("kmax", 1),
                cfg.get("dig", 3),
                frac,
                cfg.get("copy", 0.0),
            )
            for i in range(math.ceil(steps * bs / chunk) + 2)
        ],
    )
    buf_r = buf_t = None
    pos = 0
    hit = None
    for step in range(steps):
        if buf_r is None or pos + bs > len(buf_r):
            r, t = next(it)
            buf_r = torch.from_numpy(r)
            buf_t = torch.from_numpy(t)
            pos = 0
        x = buf_r[pos : pos + bs].to(dev)
        tr = buf_t[pos : pos + bs, 1:].to(dev)
        pos += bs
        with torch.autocast("cuda", torch.bfloat16, enabled=dev == "cuda"):
            logits = model(x[:, :-1], use_cache=False).logits.float()
        tl = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        needle_row = ~tr.all(1, keepdim=True)
        w = tr.float() * torch.where(needle_row, aw, 1.0)
        loss = (tl * w).sum() / w.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % cfg.get("every", 250) == 0 or step + 1 == steps:
            r, lp = evalfn()
            p(f"{tag} step {step + 1} loss {loss.item():.3f} acc {r} lp {lp} {time.time() - t0:.0f}s")
            m = sum(r.values()) / len(r)
            if hit is None and m >= 0.8:
                hit = step + 1
            if stop(m) or time.time() - t0 > cfg.get("budget", 400):
                break
    return hit, step + 1


def run(cfg):
    from multiprocessing import Pool

    from transformers import AutoConfig, AutoModelForCausalLM

    name = cfg["name"]
    log_path = os.path.join(OUT, f"{name}.log")

    def p(*a):
        s = " ".join(map(str, a))
        with open(log_path, "a") as log:
            log.write(s + "\n")

    t0 = time.time()
    g, v, dig = cfg.get("g", 3), cfg.get("v", 4000), cfg.get("dig", 3)
    L, bs = cfg.get("L", 256), cfg.get("bs", 16)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    _init(g, v)
    tok, hay = _W["tok"], _W["hay"]
    h = cfg.get("h", 128)
    c = AutoConfig.for_model(
        "llama",
        vocab_size=len(tok),
        hidden_size=h,
        intermediate_size=int(h * 2.75),
        num_hidden_layers=cfg.get("nl", 4),
        num_attention_heads=cfg.get("nh", 4),
        num_key_value_heads=cfg.get("kv", 2),
        max_position_embeddings=8192,
        tie_word_embeddings=cfg.get("tie", True),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    c.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    torch.manual_seed(cfg.get("seed", 0))
    model = AutoModelForCausalLM.from_config(c, attn_implementation="sdpa").to(dev)
    lr = cfg.get("lr", 3e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    within = lambda: evaluate(model, tok, hay, [64, 128, 192], 20, dig, dev)
    with Pool(cfg.get("procs", 2), initializer=_init, initargs=(g, v)) as pool:
        hit, done = train(
            model,
            opt,
            sched,
            pool,
            cfg,
            L,
            bs,
            cfg.get("steps", 6000),
            cfg.get("frac", 0.5),
            p,
            dev,
            "base",
            within,
            t0,
            lambda m: m >= 0.95,
        )
        p(
            f"RESULT-BASE {name} >=0.8 at step {hit} ({hit and hit * bs * L / 1e6}M tok) stopped {done} "
            f"{time.time() - t0:.0f}s"
        )
        beyond = evaluate(model, tok, hay, [384, 768, 1536], 10, dig, dev)
        p(f"base beyond {beyond}")
        es = cfg.get("ext_steps", 0)
        if es and (hit or cfg.get("force_ext")):
            from easy_context.models import set_rope_theta

            set_rope_theta(model.config, cfg.get("theta", 200000))
            model.model.rotary_emb = type(model.model.rotary_emb)(model.config).to(dev)
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.get("ext_lr", 1e-3), betas=(0.9, 0.95), weight_decay=0.0)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
            el = cfg.get("ext_L", 2048)
            far = lambda: evaluate(model, tok, hay, [384, 768, 1536], 10, dig, dev)
            t1 = time.time()
            cfg2 = dict(cfg, every=cfg.get("ext_every", 50), budget=10**9)
            train(
                model,
                opt,
                sched,
                pool,
                cfg2,
                el,
                cfg.get("ext_bs", 2),
                es,
                cfg.get("ext_frac", cfg.get("frac", 0.5)),
                p,
                dev,
                "ext",
                far,
                t1,
                lambda m: False,
            )
            p(f"ext within {within()} beyond {far()} {time.time() - t0:.0f}s")


if __name__ == "__main__":
    if sys.argv[1].endswith(".json"):  # FILE KEY: run that sweep, one process per configuration
        from easy_context.data.sources import load_documents
        from easy_context.data.tokenizer import train_byte_level_bpe

        with open(sys.argv[1]) as f:
            cfgs = json.load(f)[sys.argv[2]]
        os.makedirs(OUT, exist_ok=True)
        for g, v in {(c.get("g", 3), c.get("v", 4000)) for c in cfgs}:
            train_byte_level_bpe(load_documents(PG), v, tokdir(g, v), digit_group=g)
        procs = [subprocess.Popen([sys.executable, __file__, json.dumps(c)]) for c in cfgs]
        for pr in procs:
            pr.wait()
    else:
        run(json.loads(sys.argv[1]))
