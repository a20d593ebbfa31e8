#!/usr/bin/env python3
"""Golden token ids for Ember's tokenizer tests, made with llama.cpp.

The reference is llama.cpp through llama-cpp-python, loaded with
vocab_only=True on the same GGUF the C++ tests use. The golden files in
tests/golden/tokenizer/ are what `gen` writes:

  smollm2_cases.txt    edge cases + seeded random strings, with their ids
  smollm2_books.txt    per-book token count, FNV-1a hash and checkpoints
  smollm2_unicode.txt  every code point in a few contexts, hashed per block
  smollm2_pre_<pre>.txt  the same vocabulary with tokenizer.ggml.pre set to
                       gpt-2, default and llama-bpe (made as vocab-only GGUF
                       copies in a temporary directory): the edge cases and
                       random strings, and the books' token counts and hashes

Gemma 3 (SentencePiece "llama" vocabulary), written by `gen-gemma3`:

  gemma3_cases.txt     edge cases, Gemma special tokens, invalid UTF-8 (which
                       SPM encodes as byte tokens) and seeded random strings
  gemma3_books.txt     as smollm2_books.txt, plus "sample" lines: the first
                       SAMPLE_TOKENS ids of each book in full
  gemma3_unicode.txt   as smollm2_unicode.txt
  gemma3_detok.txt     llama_detokenize(ids, remove_special, unparse_special)
                       for all four flag pairs on the cases' ids (with BOS),
                       and FNV-1a hashes of llama_token_to_piece for every id
                       (special=0 and special=1)

Usage (the reference venv has llama-cpp-python):
  PY=/root/.cache/ember/refvenv/bin/python
  $PY tools/tokenizer_golden.py gen [--model M] [--data-dir D] [--out-dir O]
  $PY tools/tokenizer_golden.py gen-gemma3 [--model M] [--data-dir D] [--out-dir O]
      (--model defaults to $EMBER_HOME/gemma-3-270m-q4_k_m.gguf here)
  $PY tools/tokenizer_golden.py gen --pre-only qwen2   only smollm2_pre_qwen2.txt
  $PY tools/tokenizer_golden.py diff BOOK.txt OURS.ids [--model M]
      first differing position between llama.cpp and ids dumped by the C++
      test (EMBER_TOKENIZER_DUMP_DIR=dir ./test_tokenizer writes dir/<book>.ids
      when a book's hash does not match), with the text around it
  $PY tools/tokenizer_golden.py probe-invalid [--model M]
      what llama.cpp does with invalid UTF-8 (Ember rejects it)

Formats (all text, '#' starts a comment line):
  cases:   blocks of
             case <name>
             flags add_special=<0|1> parse_special=<0|1>
             text <hex of the UTF-8 bytes>        ("text -" for empty)
             ids <id> <id> ...                    ("ids -" for none)
           separated by blank lines.
  books:   book <file name> bytes=<n> text_fnv=<hex> tokens=<n> ids_fnv=<hex>
           checkpoint <file name> <n tokens> <ids_fnv of the first n>   (every 65536)
  unicode: block <first cp hex> <last cp hex> tokens=<n> ids_fnv=<hex>
           The text of a block is, for each code point c in [first, last]
           except surrogates, the UTF-8 of  "x" c "y " c "y" c c " 1" c "\\n".
  pre:     "case" blocks as above, and "book" lines as above without checkpoints.
  sample:  sample <file name> <first id> <id> ...        (gemma3_books.txt)
  detok:   blocks of
             detok <case name>
             ids <id> ...                         (encoded with add_special=1 parse_special=1)
             out <remove_special><unparse_special> <hex of the bytes>   ("-" when empty), four lines
           and "pieces special=<0|1> n=<n_vocab> fnv=<hex>": FNV-1a 64 over, for each id
           in order, the piece's length as little-endian uint32 followed by its bytes.
  ids_fnv is FNV-1a 64 over the ids as little-endian int32 bytes; text_fnv is
  FNV-1a 64 over the file's bytes. The books are encoded with
  add_special=0 parse_special=0.
"""

import argparse
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
DEFAULT_MODEL = os.path.join(os.environ.get("EMBER_HOME", os.path.expanduser("~/.cache/ember")),
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_DATA = os.path.normpath(os.path.join(ROOT, "..", "shared", "data"))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "tokenizer")
CHECKPOINT_EVERY = 65536
SAMPLE_TOKENS = 1024
GEMMA_MODEL = os.path.join(os.environ.get("EMBER_HOME", os.path.expanduser("~/.cache/ember")),
                           "gemma-3-270m-q4_k_m.gguf")
UNICODE_BLOCK = 4096

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1


def fnv1a_bytes(data, h=FNV_OFFSET):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return h


def fnv1a_ids(ids, h=FNV_OFFSET):
    for i in ids:
        for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
            h = ((h ^ b) * FNV_PRIME) & MASK64
    return h


def load(model):
    try:
        import llama_cpp
    except ImportError:
        sys.exit("llama_cpp not importable: run with /root/.cache/ember/refvenv/bin/python")
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    return llama_cpp, llm


def tokenize(llm, data, add_special, parse_special):
    if not data:
        # llama-cpp-python returns [] early for empty input in some versions;
        # llama.cpp itself gives [] (+BOS/EOS when add_special and the model adds them).
        pass
    return list(llm.tokenize(data, add_bos=add_special, special=parse_special))


# ---------------------------------------------------------------------------
# Test inputs

SPECIAL_CASES = [
    ("chatml", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
    ("endoftext", "a<|endoftext|>b"),
    ("adjacent_specials", "<|im_start|><|im_end|><|endoftext|>"),
    ("special_in_word", "abc<|im_end|>def"),
    ("special_spaces", " <|im_start|> x <|im_end|> "),
    ("partial_special", "<|im_start|<|im_end"),
    ("nested_brackets", "<<|im_start|>>"),
    ("reponame", "<reponame>my/repo<file_sep>main.py"),
    ("jupyter", "<jupyter_start><jupyter_code>print(1)<jupyter_output>1"),
    ("special_repeat", "<|im_end|>" * 5),
]

EDGE_CASES = [
    ("empty", ""),
    ("space", " "),
    ("two_spaces", "  "),
    ("many_spaces", " " * 37),
    ("tab", "\t"),
    ("newline", "\n"),
    ("crlf", "\r\n"),
    ("blank_lines", "\n\n\n\n"),
    ("ws_mix", " \n\n  \t\t x"),
    ("ws_mix2", "a \t\n b\r\n\r\n  c  \t"),
    ("tabs_indent", "\tdef f():\n\t\treturn 1\n"),
    ("space_indent", "    if x:\n        y = 2\n"),
    ("trailing_spaces", "hello   "),
    ("leading_spaces", "   hello"),
    ("double_space_word", "a  b   c    d"),
    ("space_before_newline", "end.  \nnext"),
    ("hello", "Hello world"),
    ("sentence", "The quick brown fox jumps over the lazy dog."),
    ("digits", "0 1 12 123 1234 12345"),
    ("long_number", "1234567890123456789012345678901234567890"),
    ("decimal", "3.14159 2,718 1e-10 -42 +7"),
    ("money", "$1,000,000.00 and 50% off"),
    ("digits_in_words", "x2y3 abc123def 4th 1st"),
    ("space_digit", " 42  7   9"),
    ("arabic_indic_digits", "\u0663\u0664\u0665 \u06f1\u06f2"),
    ("superscript_fraction", "x\u00b2 + y\u00b3 = \u00bd \u2153"),
    ("circled_roman", "\u2460\u2461 \u216b \u2167"),
    ("fullwidth_digits", "\uff11\uff12\uff13"),
    ("contractions", "I'm don't we're they've he'll she'd it's"),
    ("contractions_upper", "I'M DON'T WE'RE THEY'VE HE'LL SHE'D IT'S"),
    ("apostrophes", "'s 't 're 've 'm 'll 'd ' '' rock'n'roll O'Neil"),
    ("curly_quotes", "\u2018quoted\u2019 \u201cdouble\u201d it\u2019s"),
    ("punctuation", "Hello, world! ...!!!??? a--b (x) [y] {z}"),
    ("symbols", "<html> $100 @user #tag `code` ~/path/to_file.txt a|b ^ & *"),
    ("math", "a+b=c; x<=y>=z != w -> v => u"),
    ("code", "def f(x):\n    return x**2  # square\n\nprint(f(3))\n"),
    ("json", '{"key": [1, 2.5, "v\\n"], "ok": true}'),
    ("url", "https://example.com/path?q=1&b=2#frag"),
    ("emoji", "\U0001F600"),
    ("emoji_text", "I love it \U0001F60D\U0001F60D!"),
    ("emoji_skin_tone", "\U0001F44D\U0001F3FD"),
    ("emoji_zwj_family", "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466"),
    ("emoji_flag_rainbow", "\U0001F3F3\uFE0F\u200D\U0001F308"),
    ("emoji_heart_vs", "\u2764\uFE0F"),
    ("emoji_regional_flags", "\U0001F1EF\U0001F1F5\U0001F1FA\U0001F1F8"),
    ("emoji_spaced", " \U0001F600 \U0001F600  \U0001F600"),
    ("emoji_keycap", "1\uFE0F\u20E3 #\uFE0F\u20E3"),
    ("emoji_15", "\U0001FAE8 \U0001FA77"),
    ("cjk_zh", "\u4f60\u597d\uff0c\u4e16\u754c\uff01"),
    ("cjk_ja", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002"),
    ("cjk_ko", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8"),
    ("cjk_mixed", "\u6f22\u5b57\u304b\u306a\u30ab\u30ca abc 123"),
    ("cjk_ext", "\U00020000\U0002A6D6 \U00031350 \U0002EBF0"),
    ("accents", "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m"),
    ("combining", "cafe\u0301 e\u0300\u0301\u0302 n\u0303"),
    ("zalgo", "Z\u0337\u0322a\u0338l\u0334g\u0335o\u0336"),
    ("arabic", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645"),
    ("arabic_diacritics", "\u0628\u0650\u0633\u0652\u0645\u0650 \u0671\u0644\u0644\u0651\u064e\u0647\u0650"),
    ("hebrew", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd"),
    ("devanagari", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e"),
    ("thai", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a"),
    ("cyrillic", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!"),
    ("greek", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03b1\u03b2\u03b3"),
    ("mixed_scripts", "Hello\u4e16\u754c123\u0430\u0431\u0432"),
    ("nbsp", "a\u00a0b \u00a0c"),
    ("ideographic_space", "a\u3000b\u3000\u3000c"),
    ("em_space", "a\u2003b \u2009 c"),
    ("zero_width", "a\u200bb\u200cc\u200dd\ufeffe"),
    ("line_separators", "a\u2028b\u2029c\u0085d"),
    ("nul", "\x00"),
    ("control_chars", "\x01\x02\x1b[0m\x7f"),
    ("file_separators", "a\x1cb\x1dc\x1ed\x1f"),
    ("soft_hyphen", "co\u00adop"),
    ("private_use", "\ue000\uf8ff"),
    ("noncharacters", "\ufdd0\ufffe\uffff"),
    ("max_codepoint", "\U0010FFFF\U000E0001"),
    ("replacement_char", "\ufffd"),
    ("unassigned", "\u0378\U0001FFFF"),
    ("all_ascii", "".join(chr(i) for i in range(128))),
    ("latin1", "".join(chr(i) for i in range(0x80, 0x100))),
    ("repeated_a", "a" * 300),
    ("repeated_ab", "ab" * 200),
    ("repeated_newlines", "\n" * 50),
    ("repeated_digits", "7" * 64),
    ("repeated_dots", "." * 100),
    ("long_word", "pneumonoultramicroscopicsilicovolcanoconiosis" * 3),
] + SPECIAL_CASES

RANDOM_POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") + list("0123456789") * 2
    + [" "] * 12 + ["\n", "\t", "\r", "  ", "'s", "'re", "'", "\u2019"]
    + list(".,;:!?-_()[]{}<>/\\\"#$%&*+=@^`|~")
    + ["\u00e9", "\u00fc", "\u00df", "\u0301", "\u0308", "\u00a0", "\u3000", "\u2003", "\u200d", "\ufe0f",
       "\u4e2d", "\u6587", "\u3042", "\u30a2", "\ud55c", "\u0627", "\u0644", "\u05d0", "\u0915", "\u094d",
       "\u0e01", "\u0416", "\u03a9", "\u00b2", "\u0663", "\u2460", "\u216b", "\uff11",
       "\U0001F600", "\U0001F44D", "\U0001F3FD", "\U0001F468", "\U0001F1EF", "\u2764", "\U0001FAE8",
       "\x00", "\x1b", "\x7f", "\u00ad", "\ufffd", "\ue000", "\U00020000", "\u0378",
       "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<reponame>", "<|im_"]
)


def random_cases(n=300, seed=1234):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 55])
        text = "".join(rng.choice(RANDOM_POOL) for _ in range(length))
        out.append(("random_%03d" % i, text))
    return out


def unicode_block_text(first, last):
    parts = []
    for cp in range(first, last + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        parts.append("x" + c + "y " + c + "y" + c + c + " 1" + c + "\n")
    return "".join(parts).encode("utf-8")


# ---------------------------------------------------------------------------
# Commands

def header(llama_cpp, model, what):
    return [
        "# " + what,
        "# Reference: llama.cpp via llama-cpp-python %s, Llama(model_path, vocab_only=True)"
        % getattr(llama_cpp, "__version__", "?"),
        "# Model: %s" % os.path.basename(model),
        "# Generated by: /root/.cache/ember/refvenv/bin/python tools/tokenizer_golden.py gen",
        "# Format: see the docstring of tools/tokenizer_golden.py",
    ]


def cmd_gen(args):
    if args.pre_only:
        import llama_cpp
        gen_pre_variants(llama_cpp, args, [args.pre_only])
        return
    llama_cpp, llm = load(args.model)
    os.makedirs(args.out_dir, exist_ok=True)

    # Cases.
    lines = header(llama_cpp, args.model, "Tokenizer edge cases and seeded random strings (SmolLM2 'smollm' BPE).")
    cases = EDGE_CASES + random_cases()
    n = 0
    for name, text in cases:
        data = text.encode("utf-8")
        for add_special, parse_special in ((0, 0), (0, 1)) + (((1, 1),) if name in ("hello", "empty") else ()):
            ids = tokenize(llm, data, bool(add_special), bool(parse_special))
            lines.append("")
            lines.append("case %s" % name)
            lines.append("flags add_special=%d parse_special=%d" % (add_special, parse_special))
            lines.append("text %s" % (data.hex() if data else "-"))
            lines.append("ids %s" % (" ".join(map(str, ids)) if ids else "-"))
            n += 1
    path = os.path.join(args.out_dir, "smollm2_cases.txt")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s (%d cases)" % (path, n))

    # Books.
    lines = header(llama_cpp, args.model, "Token count and hashes for the books in shared/data/ (add_special=0 parse_special=0).")
    for name in sorted(os.listdir(args.data_dir)):
        if not name.endswith(".txt"):
            continue
        with open(os.path.join(args.data_dir, name), "rb") as f:
            data = f.read()
        ids = tokenize(llm, data, False, False)
        lines.append("book %s bytes=%d text_fnv=%016x tokens=%d ids_fnv=%016x"
                     % (name, len(data), fnv1a_bytes(data), len(ids), fnv1a_ids(ids)))
        h = FNV_OFFSET
        for start in range(0, len(ids), CHECKPOINT_EVERY):
            chunk = ids[start:start + CHECKPOINT_EVERY]
            h = fnv1a_ids(chunk, h)
            if start + len(chunk) < len(ids):
                lines.append("checkpoint %s %d %016x" % (name, start + len(chunk), h))
        print("%s: %d bytes, %d tokens" % (name, len(data), len(ids)))
    path = os.path.join(args.out_dir, "smollm2_books.txt")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s" % path)

    # Unicode sweep.
    lines = header(llama_cpp, args.model, "Every code point in a few contexts, hashed per block of %d code points." % UNICODE_BLOCK)
    for first in range(0, 0x110000, UNICODE_BLOCK):
        last = first + UNICODE_BLOCK - 1
        data = unicode_block_text(first, last)
        if not data:
            continue
        ids = tokenize(llm, data, False, False)
        lines.append("block %06x %06x tokens=%d ids_fnv=%016x" % (first, last, len(ids), fnv1a_ids(ids)))
    path = os.path.join(args.out_dir, "smollm2_unicode.txt")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s" % path)

    gen_pre_variants(llama_cpp, args, PRE_VARIANTS)


PRE_VARIANTS = ["gpt-2", "default", "llama-bpe", "qwen2"]


def make_variant(src, dst, pre):
    """A vocab-only copy of the GGUF at src (all metadata, no tensors) with tokenizer.ggml.pre = pre."""
    from gguf import GGUFReader, GGUFWriter, GGUFValueType
    r = GGUFReader(src)
    w = GGUFWriter(dst, r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        val = pre if name == "tokenizer.ggml.pre" else f.contents()
        vtype = f.types[0]
        w.add_key_value(name, val, vtype, sub_type=f.types[-1] if vtype == GGUFValueType.ARRAY else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gen_pre_variants(llama_cpp, args, variants):
    import tempfile
    books = []
    for name in sorted(os.listdir(args.data_dir)):
        if name.endswith(".txt"):
            with open(os.path.join(args.data_dir, name), "rb") as f:
                books.append((name, f.read()))
    with tempfile.TemporaryDirectory() as tmp:
        for pre in variants:
            path = os.path.join(tmp, "variant.gguf")
            make_variant(args.model, path, pre)
            llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
            lines = header(llama_cpp, args.model,
                           "The SmolLM2 vocabulary with tokenizer.ggml.pre = '%s' (vocab-only copy of the GGUF)." % pre)
            for name, text in EDGE_CASES + random_cases():
                data = text.encode("utf-8")
                for parse_special in ((0, 1) if (name, text) in SPECIAL_CASES else (0,)):
                    ids = tokenize(llm, data, False, bool(parse_special))
                    lines += ["", "case %s" % name, "flags add_special=0 parse_special=%d" % parse_special,
                              "text %s" % (data.hex() if data else "-"), "ids %s" % (" ".join(map(str, ids)) or "-")]
            lines.append("")
            for name, data in books:
                ids = tokenize(llm, data, False, False)
                lines.append("book %s bytes=%d text_fnv=%016x tokens=%d ids_fnv=%016x"
                             % (name, len(data), fnv1a_bytes(data), len(ids), fnv1a_ids(ids)))
            del llm
            out = os.path.join(args.out_dir, "smollm2_pre_%s.txt" % pre)
            with open(out, "w", encoding="ascii") as f:
                f.write("\n".join(lines) + "\n")
            print("wrote %s" % out)


# ---------------------------------------------------------------------------
# Gemma 3 (SPM)

GEMMA_SPECIAL_CASES = [
    ("turns", "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"),
    ("bos_eos", "<bos>text<eos>"),
    ("bos_first", "<bos>Hello"),
    ("adjacent_specials", "<start_of_turn><end_of_turn><eos><bos>"),
    ("special_in_word", "abc<end_of_turn>def"),
    ("special_spaces", " <start_of_turn> x <end_of_turn> "),
    ("partial_special", "<start_of_turn<end_of_tur"),
    ("nested_brackets", "<<start_of_turn>>"),
    ("unused", "<unused0><unused6241>x<unused99>"),
    ("image", "<start_of_image><end_of_image>[multimodal]"),
    ("pad_unk_mask", "<pad><unk><mask>"),
    ("special_repeat", "<end_of_turn>" * 5),
    ("tabs_newlines_ud", "\t\t\t\n\n\n\n x\t\n\t"),
    ("html", "<table><tr><td>1</td></tr></table><br/><h1>T</h1>"),
]

GEMMA_INVALID_CASES = [
    ("invalid_ff", b"\xff"),
    ("invalid_cont", b"a\x80b"),
    ("invalid_trunc2", b"ok\xc3"),
    ("invalid_trunc3", b"\xe2\x82"),
    ("invalid_trunc3_sp", b"\xe2\x82 x"),
    ("invalid_overlong", b"\xc0\xaf"),
    ("invalid_surrogate", b"\xed\xa0\x80"),
    ("invalid_above_max", b"\xf4\x90\x80\x80"),
    ("invalid_f7", b"\xf7\xbf\xbf\xbf"),
    ("invalid_f8", b"\xf8\x88\x80\x80\x80"),
    ("invalid_mixed", b"caf\xc3\xa9 \xff\xfe na\xefve \xe4\xb8 \xf0\x9f\x98"),
    ("invalid_lead_space", b"\xc3 \xa9"),
]

GEMMA_RANDOM_EXTRA = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<unused7>", "<start_of_image>",
                      "\n\n", "\t\t", "<table>", "<start_of", "\u2581"]


def gemma_random_cases(n=300, seed=4321):
    rng = random.Random(seed)
    pool = RANDOM_POOL + GEMMA_RANDOM_EXTRA
    out = []
    for i in range(n):
        length = rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 55])
        out.append(("random_%03d" % i, "".join(rng.choice(pool) for _ in range(length))))
    return out


def llama_detokenize(llama_cpp, vocab, ids, remove_special, unparse_special):
    import ctypes
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), None, 0, remove_special, unparse_special)
    if n >= 0:
        return b""
    buf = ctypes.create_string_buffer(-n)
    m = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, -n, remove_special, unparse_special)
    assert m == -n
    return buf.raw[:m]


def token_piece(llama_cpp, vocab, tid, special):
    import ctypes
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, tid, buf, 64, 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, tid, buf, -n, 0, special)
    return buf.raw[:n]


def cmd_gen_gemma3(args):
    model = args.model if args.model != DEFAULT_MODEL else GEMMA_MODEL
    llama_cpp, llm = load(model)
    vocab = llm._model.vocab
    os.makedirs(args.out_dir, exist_ok=True)
    hdr = lambda what: [h.replace("tokenizer_golden.py gen", "tokenizer_golden.py gen-gemma3")
                        for h in header(llama_cpp, model, what)]

    # Cases: (name, bytes).
    cases = [(name, text.encode("utf-8")) for name, text in EDGE_CASES + GEMMA_SPECIAL_CASES]
    cases += GEMMA_INVALID_CASES
    cases += [(name, text.encode("utf-8")) for name, text in gemma_random_cases()]
    lines = hdr("Tokenizer edge cases, invalid UTF-8 and seeded random strings (Gemma 3 SPM).")
    n = 0
    both_flags = set(["hello", "empty", "space", "leading_spaces", "newline", "emoji", "cjk_zh"]
                     + [c[0] for c in GEMMA_SPECIAL_CASES] + [c[0] for c in SPECIAL_CASES])
    for name, data in cases:
        flags = [(0, 0), (0, 1)]
        if name in both_flags or name.startswith("invalid"):
            flags += [(1, 0), (1, 1)]
        for add_special, parse_special in flags:
            ids = tokenize(llm, data, bool(add_special), bool(parse_special))
            lines += ["", "case %s" % name, "flags add_special=%d parse_special=%d" % (add_special, parse_special),
                      "text %s" % (data.hex() if data else "-"), "ids %s" % (" ".join(map(str, ids)) or "-")]
            n += 1
    path = os.path.join(args.out_dir, "gemma3_cases.txt")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s (%d cases)" % (path, n))

    # Detokenization.
    lines = hdr("llama_detokenize on the cases' ids, and token_to_piece hashes (Gemma 3 SPM).")
    for name, data in cases:
        ids = tokenize(llm, data, True, True)
        lines += ["", "detok %s" % name, "ids %s" % (" ".join(map(str, ids)) or "-")]
        for rs in (0, 1):
            for us in (0, 1):
                out = llama_detokenize(llama_cpp, vocab, ids, bool(rs), bool(us))
                lines.append("out %d%d %s" % (rs, us, out.hex() if out else "-"))
    # A few hand-made id sequences: pieces starting with spaces, BOS/EOS in odd places.
    sp = tokenize(llm, b" Hello world", False, False)
    bos, eos = llm.token_bos(), llm.token_eos()
    for name, ids in [("hand_space_first", sp), ("hand_bos_space", [bos] + sp), ("hand_eos_end", sp + [eos]),
                      ("hand_bos_bos", [bos, bos] + sp), ("hand_ctl_first", [106] + sp),
                      ("hand_byte_first", [493] + sp), ("hand_nl_first", [107] + sp)]:
        lines += ["", "detok %s" % name, "ids %s" % " ".join(map(str, ids))]
        for rs in (0, 1):
            for us in (0, 1):
                out = llama_detokenize(llama_cpp, vocab, ids, bool(rs), bool(us))
                lines.append("out %d%d %s" % (rs, us, out.hex() if out else "-"))
    lines.append("")
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    for special in (0, 1):
        h = FNV_OFFSET
        for tid in range(n_vocab):
            piece = token_piece(llama_cpp, vocab, tid, bool(special))
            h = fnv1a_bytes(len(piece).to_bytes(4, "little"), h)
            h = fnv1a_bytes(piece, h)
        lines.append("pieces special=%d n=%d fnv=%016x" % (special, n_vocab, h))
    lines.append("eog %s" % " ".join(str(t) for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)))
    lines.append("control %d" % sum(1 for t in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, t)))
    lines.append("special bos=%d eos=%d eot=%d pad=%d add_bos=%d add_eos=%d" % (
        llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab),
        llama_cpp.llama_vocab_pad(vocab), llama_cpp.llama_vocab_get_add_bos(vocab),
        llama_cpp.llama_vocab_get_add_eos(vocab)))
    path = os.path.join(args.out_dir, "gemma3_detok.txt")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s" % path)

    # Books.
    lines = hdr("Token count, hashes and the first %d ids of the books in shared/data/ "
                "(add_special=0 parse_special=0)." % SAMPLE_TOKENS)
    for name in sorted(os.listdir(args.data_dir)):
        if not name.endswith(".txt"):
            continue
        with open(os.path.join(args.data_dir, name), "rb") as f:
            data = f.read()
        ids = tokenize(llm, data, False, False)
        lines.append("book %s bytes=%d text_fnv=%016x tokens=%d ids_fnv=%016x"
                     % (name, len(data), fnv1a_bytes(data), len(ids), fnv1a_ids(ids)))
        h = FNV_OFFSET
        for start in range(0, len(ids), CHECKPOINT_EVERY):
            chunk = ids[start:start + CHECKPOINT_EVERY]
            h = fnv1a_ids(chunk, h)
            if start + len(chunk) < len(ids):
                lines.append("checkpoint %s %d %016x" % (name, start + len(chunk), h))
        lines.append("sample %s 0 %s" % (name, " ".join(map(str, ids[:SAMPLE_TOKENS]))))
        print("%s: %d bytes, %d tokens" % (name, len(data), len(ids)))
    path = os.path.join(args.out_dir, "gemma3_books.txt")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s" % path)

    # Unicode sweep.
    lines = hdr("Every code point in a few contexts, hashed per block of %d code points." % UNICODE_BLOCK)
    for first in range(0, 0x110000, UNICODE_BLOCK):
        last = first + UNICODE_BLOCK - 1
        data = unicode_block_text(first, last)
        ids = tokenize(llm, data, False, False)
        lines.append("block %06x %06x tokens=%d ids_fnv=%016x" % (first, last, len(ids), fnv1a_ids(ids)))
    path = os.path.join(args.out_dir, "gemma3_unicode.txt")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s" % path)


def cmd_diff(args):
    _, llm = load(args.model)
    with open(args.book, "rb") as f:
        data = f.read()
    ref = tokenize(llm, data, False, False)
    with open(args.ids) as f:
        ours = [int(x) for x in f.read().split()]
    n = min(len(ref), len(ours))
    first = next((i for i in range(n) if ref[i] != ours[i]), None)
    if first is None and len(ref) == len(ours):
        print("identical: %d tokens" % len(ref))
        return
    if first is None:
        first = n
    print("reference %d tokens, ours %d; first difference at token %d" % (len(ref), len(ours), first))
    piece = lambda i: llm.detokenize([i])
    lo = max(0, first - 8)
    offset = len(llm.detokenize(ref[:first])) if first else 0
    print("byte offset of the first difference in the text: ~%d" % offset)
    print("context: %r" % data[max(0, offset - 80):offset + 80])
    print("reference: " + " ".join("%d:%r" % (i, piece(i)) for i in ref[lo:first + 8]))
    print("ours:      " + " ".join("%d:%r" % (i, piece(i)) for i in ours[lo:first + 8]))


def cmd_probe_invalid(args):
    # Each sample runs in its own process: some inputs abort llama.cpp.
    import subprocess
    samples = [b"\xff", b"a\x80b", b"\xe2\x82", b"\xe2\x82 x", b"\xc0\xaf", b"\xed\xa0\x80",
               b"\xf4\x90\x80\x80", b"\xf7\xbf\xbf\xbf", b"\xf8\x88\x80\x80\x80", b"ok\xc3"]
    for s in samples:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", args.model, "probe-one", s.hex()],
                           capture_output=True, text=True)
        if r.returncode == 0:
            out = r.stdout.strip()
        else:
            what = [ln for ln in (r.stdout + r.stderr).splitlines() if "what()" in ln]
            out = "llama.cpp aborted (exit %d) %s" % (r.returncode, what[-1].strip() if what else "")
        print("%-28r -> %s" % (s, out))


def cmd_probe_one(args):
    _, llm = load(args.model)
    s = bytes.fromhex(args.hex)
    ids = tokenize(llm, s, False, False)
    print("%r = %r" % (ids, b"".join(llm.detokenize([i]) for i in ids)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--data-dir", default=DEFAULT_DATA)
    g.add_argument("--out-dir", default=DEFAULT_OUT)
    g.add_argument("--pre-only", help="only write smollm2_pre_<PRE>.txt for this tokenizer.ggml.pre")
    g3 = sub.add_parser("gen-gemma3")
    g3.add_argument("--data-dir", default=DEFAULT_DATA)
    g3.add_argument("--out-dir", default=DEFAULT_OUT)
    d = sub.add_parser("diff")
    d.add_argument("book")
    d.add_argument("ids")
    sub.add_parser("probe-invalid")
    o = sub.add_parser("probe-one")
    o.add_argument("hex")
    args = ap.parse_args()
    {"gen": cmd_gen, "gen-gemma3": cmd_gen_gemma3, "diff": cmd_diff, "probe-invalid": cmd_probe_invalid, "probe-one": cmd_probe_one}[args.cmd](args)


if __name__ == "__main__":
    main()
