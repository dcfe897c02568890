"""Every evaluation prompt and every packed training row starts as the model was pre-trained: with the tokenizer's BOS
when its tokenizer adds one (Gemma's GGUF says ``add_bos_token`` True), once, and with nothing added when it adds none
(SmolLM2's GGUF says False; a byte-level BPE without a post-processor). The expected first ids come from what each
tokenizer was built with (the GGUF field, the BPE's template), not from :func:`start_ids` itself."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")

from easy_context.models.tokenizer import encode, start_ids  # noqa: E402
from tests.support.gemma_gguf import essays, train_pieces, write_gemma_gguf  # noqa: E402

# Gemma 3's own chat template writes ``bos_token`` itself: encoding its text must not add a second one
GEMMA_CHAT = ("{{ bos_token }}{% for m in messages %}<start_of_turn>user\n{{ m['content'] }}<end_of_turn>\n"
              "{% endfor %}<start_of_turn>model\n")  # fmt: skip
TEXT = "The grass is green. The sky is blue. " * 40


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict:
    """name -> (tokenizer, the ids it must start a sequence with)."""
    from tokenizers import processors

    from easy_context.data.tokenizer import train_byte_level_bpe
    from easy_context.models.gguf import load_gguf_tokenizer
    from tests.support.gguf_writer import tiny_llama, train_tokenizer, write_tiny_llama_gguf

    root = tmp_path_factory.mktemp("start_ids")
    lines = essays(200_000)
    if len(lines) < 100:
        raise AssertionError("PaulGrahamEssays/ holds too little text (python PaulGrahamEssays/fetch.py)")
    out = {}
    _, pieces = train_pieces(lines, vocab_size=800)
    gemma = load_gguf_tokenizer(write_gemma_gguf(root / "gemma.gguf", pieces, chat_template=GEMMA_CHAT))
    out["gemma_gguf"] = (gemma, [pieces.index("<bos>")])
    bpe = train_tokenizer(root / "bpe")  # SmolLM2's file: a gpt2-style BPE, add_bos_token False
    smol = load_gguf_tokenizer(write_tiny_llama_gguf(root / "smol.gguf", tiny_llama(bpe), root / "bpe", add_bos=False))
    out["smollm2_gguf"] = (smol, [])
    out["bpe"] = (train_byte_level_bpe(lines[:400], 400, str(root / "plain")), [])
    with_bos = train_byte_level_bpe(lines[:400], 400, str(root / "bos"))
    bos = with_bos.convert_tokens_to_ids("<s>")
    with_bos.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    out["bpe_bos"] = (with_bos, [bos])
    return out


NAMES = ["gemma_gguf", "smollm2_gguf", "bpe", "bpe_bos"]


def starts_once(ids: list[int], start: list[int], plain: list[int] | None = None) -> None:
    """``ids`` begin with ``start`` and not with it twice; without start ids, ``ids`` are the text's own."""
    assert ids[: len(start)] == start, ids[:4]
    if start:
        assert ids[len(start) : 2 * len(start)] != start, ids[:4]
    elif plain is not None:
        assert ids == plain


@pytest.mark.parametrize("name", NAMES)
def test_start_ids_are_what_the_tokenizer_was_built_to_put_first(tokenizers, name):
    tok, want = tokenizers[name]
    assert start_ids(tok) == want
    assert encode(tok, "hello there") == tok("hello there")["input_ids"]  # what the tokenizer itself gives, no EOS


@pytest.mark.parametrize("name", NAMES)
def test_fixed_and_needle_prompts_and_ppl_windows_start_with_bos_once(tokenizers, name):
    from easy_context.eval.fixed_prompts import PROMPTS, prompt_ids
    from easy_context.eval.perplexity import window_inputs, windows
    from easy_context.eval.scoring import answer_split
    from easy_context.tasks.haystack import Haystack
    from easy_context.tasks.needle import make_case

    tok, start = tokenizers[name]
    if name == "gemma_gguf":  # the template's own <bos>, once
        assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<bos>")
    for prompt, chat, _ in PROMPTS:
        starts_once(prompt_ids(tok, prompt, chat), start)
    case = make_case(Haystack.from_text(TEXT, tok), 200, 50.0, sample=0)
    ids, first = answer_split(tok, case.prompt, case.answer)
    starts_once(ids, start, tok(case.prompt + case.answer, add_special_tokens=False)["input_ids"])
    assert tok.decode(ids[first:]).endswith(case.answer.strip())  # a small vocabulary may merge ": " into it
    doc = tok(TEXT, add_special_tokens=False)["input_ids"]
    for win in windows(len(doc), 64, 32, truncate=False):
        ids, targets = window_inputs(doc, win, start_ids(tok))
        starts_once(ids, start, doc[win.begin : win.end])
        assert len(ids) == len(targets) == len(start) + win.end - win.begin


@pytest.mark.parametrize("name", NAMES)
def test_ruler_prompts_start_with_bos_once(tokenizers, name):
    from easy_context.eval.run_ruler import prompt_wrapper
    from easy_context.tasks.ruler.builders import TASKS, make_case

    tok, start = tokenizers[name]
    for template in ("base", "chat") if name == "gemma_gguf" else ("base",):
        wrap, _ = prompt_wrapper(tok, template)
        for task in ("niah_single_1", "niah_multikey_2", "vt", "fwe"):
            case = make_case(TASKS[task], 1024, 0, lambda text: len(encode(tok, text)), wrap)
            ids = encode(tok, case.text)
            starts_once(ids, start, tok(case.text, add_special_tokens=False)["input_ids"])
            assert len(ids) + case.max_new_tokens <= 1024


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("streaming,pack", [(False, "concat"), (False, "documents"), (True, "documents")])
def test_packed_rows_and_their_documents_start_with_bos_once(tokenizers, name, streaming, pack):
    import numpy as np

    from easy_context.data.prepare import prepare_dataset

    tok, start = tokenizers[name]
    docs = [f"Document {i}. " + TEXT[: 50 + 37 * i] for i in range(24)]
    ds = prepare_dataset(docs, tok, 48, pack=pack, streaming=streaming, max_memory_gb=0.01, show_progress=False)
    rows = np.asarray(ds["input_ids"])
    assert len(rows) >= 8
    if not start:  # nothing added: the rows are the documents' own ids and EOS, in some order
        own = {t for d in docs for t in tok(d, add_special_tokens=False)["input_ids"]} | {tok.eos_token_id}
        assert set(rows.ravel().tolist()) <= own and tok.bos_token_id not in own
        return
    (bos,) = start
    # every row, but one cut right after a document's last token: that EOS, then the next document's BOS
    assert ((rows[:, 0] == bos) | ((rows[:, 0] == tok.eos_token_id) & (rows[:, 1] == bos))).all()
    after_eos = rows[:, 1:][rows[:, :-1] == tok.eos_token_id]
    assert (after_eos == bos).all() and after_eos.size >= 8  # every document
    assert not ((rows[:, :-1] == bos) & (rows[:, 1:] == bos)).any()  # never twice
    if pack == "documents":
        positions = np.asarray(ds["position_ids"])
        assert (rows[:, 1:][positions[:, 1:] == 0] == bos).all()  # each document attended on its own: BOS first
