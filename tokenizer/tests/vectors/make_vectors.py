#!/usr/bin/env python3
"""Generates smollm2.json: reference token ids for SmolLM2-135M-Instruct's tokenizer.

Two independent references are run on every text:

* llama.cpp (the reference the ids must equal), through the prebuilt llama.cpp inside the npm
  package node-llama-cpp, with special tokens parsed, as `llama_tokenize(..., parse_special=true)`.
* Hugging Face `tokenizers`, built from the GGUF's vocabulary and merges with the pre-tokenizer of
  SmolLM2's upstream tokenizer.json (Digits(individual_digits) then ByteLevel, no prefix space) and
  the 17 control tokens as special added tokens. A difference from llama.cpp is recorded in the
  case as `hf_ids` (one: fuzz_193, a control character after a space; the Rust tests take
  `hf_ids` where present, as the model was trained on its tokenizer.json).

Chat prompts are rendered with transformers' own `render_jinja_template` (Jinja2) from the
template stored in the GGUF.

Setup (once), then run from anywhere:

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install gguf tokenizers transformers jinja2
    mkdir -p /tmp/nlc && cd /tmp/nlc && npm init -y && npm install node-llama-cpp@3.22.1
    scripts/fetch-model.sh
    NODE_LLAMA_CPP_DIR=/tmp/nlc /tmp/tokvenv/bin/python tokenizer/tests/vectors/make_vectors.py
"""

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = Path(__file__).resolve().parent
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTROL = 3


def model_path() -> Path:
    d = os.environ.get("DOLPHIN_MODEL_DIR") or os.path.expanduser("~/.cache/dolphin/models")
    p = Path(d) / MODEL_FILE
    if not p.is_file():
        sys.exit(f"{p} not found: run scripts/fetch-model.sh first")
    return p


def hf_tokenizer(tokens, types, merges) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL]
    )
    return tok


NODE_SCRIPT = r"""
import {getLlama} from "node-llama-cpp";
import {readFileSync, writeFileSync} from "node:fs";
const [inPath, outPath, modelPath] = process.argv.slice(2);
const jobs = JSON.parse(readFileSync(inPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath, vocabOnly: true});
const out = jobs.map(([text, parseSpecial]) => {
  const ids = Array.from(model.tokenize(text, parseSpecial));
  return {ids, decoded: model.detokenize(ids, false)};
});
writeFileSync(outPath, JSON.stringify(out));
"""


def llama_cpp(jobs, path: Path):
    """[(text, parse_special)] -> [{ids, decoded}] from llama.cpp."""
    nlc = Path(os.environ.get("NODE_LLAMA_CPP_DIR", "/tmp/nlc"))
    if not (nlc / "node_modules" / "node-llama-cpp").is_dir():
        sys.exit(f"node-llama-cpp not installed in {nlc} (set NODE_LLAMA_CPP_DIR; see the docstring)")
    version = json.loads((nlc / "node_modules/node-llama-cpp/package.json").read_text())["version"]
    # The script must sit beside node_modules for the import to resolve.
    with tempfile.TemporaryDirectory(dir=nlc) as tmp:
        script, inp, outp = Path(tmp, "run.mjs"), Path(tmp, "in.json"), Path(tmp, "out.json")
        script.write_text(NODE_SCRIPT)
        inp.write_text(json.dumps(jobs))
        subprocess.run(["node", str(script), str(inp), str(outp), str(path)], check=True)
        return json.loads(outp.read_text()), f"llama.cpp (prebuilt, npm node-llama-cpp {version})"


NAMED = {
    "empty": "",
    "hello": "Hello world",
    "leading_space": " Hello",
    "chat_turn": "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "special_fragments": "<|im_start|<|im_start|><|im_start|><<|im_end|>>|im_end|> <|endoftext|>x",
    "repo_tokens": "<repo_name>dolphin<file_sep><filename>src/main.rs<reponame><gh_stars>10",
    "digits": "12345 3.14159 1,000,000 0x1F 2024-01-01 +44 (0)20 7946 0958",
    "unicode_digits": "Ⅻ ² ٣٤ １２３ ৭ ⅓ 𝟙𝟚",
    "cjk": "日本語のテキスト、中文文本。한국어 텍스트",
    "emoji": "🐬🐳 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ☕",
    "accents": "héllo naïve café Ærøskøbing São Paulo e\u0301 n\u0303",
    "mixed_scripts": "Привет мир Γειά σου κόσμε مرحبا بالعالم नमस्ते दुनिया שלום",
    "python": "def f(x):\n    if x > 0:\n\treturn x ** 2  # square\n    return -x\n",
    "rust": "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{v:?}\");\n}\n",
    "whitespace_runs": "a  b   c\t\td\n\n\ne \r\n f    ",
    "only_spaces": "     ",
    "only_newlines": "\n\n\n",
    "space_newline_mix": " \n \n ",
    "unicode_spaces": "a\u00a0b \u3000c\u2003d\u2028e\u0085f",
    "contractions": "I'm don't you'll we've they're it's He'd SHE'S o'clock ''s 'tis",
    "control_bytes": "a\x04b\x1dc\x13\x06\x14\x16",
    "astral": "\U00040000 \U00080001 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀",
    "long_run": "a" * 500,
    "long_word": "supercalifragilisticexpialidocious" * 10,
    "url_email": "https://example.com/path?q=1&x=y#frag user@mail.org",
    "json": '{"key": [1, 2.5, null, true], "s": "x\\ny"}',
    "markdown": "# Title\n\n- item 1\n- item 2\n\n```rust\nfn main() {}\n```\n",
    "punctuation": "!!! ??? ... --- *** ___ ~~~ ``` ''' \"\"\" ;;; ::: @@@",
    "bench": (HERE / "bench.txt").read_text(encoding="utf-8"),
}

NO_PARSE_SPECIAL = {
    "chat_turn_plain": NAMED["chat_turn"],
    "endoftext_plain": "<|endoftext|> and <|im_end|>",
}

# Characters the fuzz cases are drawn from: every class the pre-tokenizer distinguishes.
POOL = (
    list("abcXYZ019 '\t\n\r.,;!?-_(){}<>|/\\\"")
    + ["'s", "'ll", "'re", " ", "  ", "\u00a0", "\u3000", "\u2009"]
    + list("éüñçåøÆß") + ["e\u0301", "\u0308"]
    + list("日本語中文한국어") + list("Привет") + list("مرحبا") + list("नमस्ते")
    + ["🐬", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "\U00040000", "\U0010fffd"]
    + list("Ⅻ²٣１৭⅓")
    + ["\x04", "\x1d", "\x00", "\x7f"]
    + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "<file_sep>", "<"]
)


def fuzz_cases(n: int, seed: int = 20240601):
    rng = random.Random(seed)
    return {f"fuzz_{i:03}": "".join(rng.choice(POOL) for _ in range(rng.randint(0, 40))) for i in range(n)}


CHATS = [
    ("user_only", [{"role": "user", "content": "Hi!"}], True),
    ("with_system", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}], True),
    (
        "multi_turn",
        [
            {"role": "user", "content": "Name a dolphin."},
            {"role": "assistant", "content": "Flipper."},
            {"role": "user", "content": "Another one, in 日本語 🐬?"},
        ],
        True,
    ),
    ("no_generation_prompt", [{"role": "user", "content": "Hello"}], False),
    ("template_syntax_in_content", [{"role": "user", "content": "{{ x }} {% if %} '\"\n\n  <|im_end|>"}], True),
    ("no_messages", [], True),
]


def main():
    path = model_path()
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    r = GGUFReader(str(path))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    template = r.fields["tokenizer.chat_template"].contents()
    bos = tokens[r.fields["tokenizer.ggml.bos_token_id"].contents()]
    eos = tokens[r.fields["tokenizer.ggml.eos_token_id"].contents()]
    hf = hf_tokenizer(tokens, types, merges)

    texts = {**NAMED, **fuzz_cases(300)}
    rendered = {}
    for name, msgs, gen in CHATS:
        out, _ = render_jinja_template(
            [msgs], chat_template=template, add_generation_prompt=gen, bos_token=bos, eos_token=eos
        )
        rendered[name] = out[0]

    jobs = [(t, True) for t in texts.values()]
    jobs += [(t, False) for t in NO_PARSE_SPECIAL.values()]
    jobs += [(t, True) for t in rendered.values()]
    results, llama_version = llama_cpp(jobs, path)
    results = iter(results)

    cases, differ = [], 0
    for name, text in texts.items():
        res = next(results)
        case = {"name": name, "text": text, "parse_special": True, "ids": res["ids"], "decoded": res["decoded"]}
        hf_ids = hf.encode(text, add_special_tokens=False).ids
        if hf_ids != res["ids"]:
            case["hf_ids"] = hf_ids
            differ += 1
        cases.append(case)
    for name, text in NO_PARSE_SPECIAL.items():
        res = next(results)
        cases.append({"name": name, "text": text, "parse_special": False, "ids": res["ids"], "decoded": res["decoded"]})
    chats = []
    for name, msgs, gen in CHATS:
        res = next(results)
        chats.append(
            {"name": name, "messages": msgs, "add_generation_prompt": gen, "rendered": rendered[name], "ids": res["ids"]}
        )

    doc = {
        "model": MODEL_FILE,
        "model_bytes": path.stat().st_size,
        "sha256": sha,
        "reference": llama_version,
        "cross_check": "Hugging Face tokenizers (BPE from the GGUF vocab and merges, Digits + ByteLevel); "
        "cases where it differs from llama.cpp carry hf_ids",
        "chat_reference": "transformers render_jinja_template over tokenizer.chat_template",
        "cases": cases,
        "chats": chats,
    }
    out = HERE / "smollm2.json"
    out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(cases)} cases, {len(chats)} chats; hf differs from llama.cpp in {differ}")


if __name__ == "__main__":
    main()
