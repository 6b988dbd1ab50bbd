"""SigLIP's tokenizer (src/text/unigram.c, spm.c) against transformers.

No SigLIP vocabulary can be downloaded, so the setup trains a small
SentencePiece Unigram model here (nmt_nfkc, T5's special ids: pad 0,
eos 1, unk 2, no bos) on the standard library's docstrings plus accented,
Greek and CJK lines, saves it as transformers' SiglipTokenizer saves a
SigLIP checkpoint (spiece.model + tokenizer_config.json), and converts it
to a tokenizer.json with transformers' SentencePiece converter.

The reference is what AutoTokenizer.from_pretrained returns for such a
directory: the slow SiglipTokenizer (transformers 5.24 has no fast one),
called as SigLIP's recipe calls it (padding="max_length", max_length=64,
truncation=True). vitc must give the same 64 ids for 10,000+ generated
strings, from either file.
"""
import json
import os
import random
import shutil
import string
import sys
import tempfile
import time
import unicodedata
import unittest
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

try:
    import sentencepiece as spm
    from transformers import AutoTokenizer, SiglipTokenizer
    from transformers.convert_slow_tokenizer import SpmConverter
except ImportError:  # pragma: no cover
    spm = None

import vitc

N_STRINGS = 10_500


def _corpus():
    """Training lines: docstrings of standard modules (English prose, code,
    punctuation) and generated lines with accents, Greek, Cyrillic, CJK."""
    import importlib
    import inspect
    warnings.simplefilter("ignore", DeprecationWarning)
    lines = []
    for name in ("os", "re", "json", "collections", "argparse", "typing", "inspect", "pathlib",
                 "subprocess", "email", "http.client", "unittest", "logging", "decimal",
                 "datetime", "textwrap", "string", "functools", "itertools", "asyncio",
                 "tarfile", "zipfile", "socket", "threading", "random", "statistics", "csv"):
        mod = importlib.import_module(name)
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj)
            if doc:
                lines.extend(l for l in doc.splitlines() if l.strip())
    rng = random.Random(0)
    extra = ["café naïve résumé façade über straße ñandú crème brûlée",
             "東京 日本語 中文 汉字 한국어 写真 猫 犬",
             "Ελληνικά ΟΔΥΣΣΕΥΣ русский язык"]
    for _ in range(3000):
        line = rng.choice(extra).split()
        lines.append(" ".join(line[rng.randrange(len(line)):]))
    return lines


def _train(prefix, lines, vocab, **kw):
    kw.setdefault("normalization_rule_name", "nmt_nfkc")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=prefix, model_type="unigram",
        vocab_size=vocab, pad_id=0, eos_id=1, unk_id=2,
        bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>", minloglevel=2,
        num_threads=1, character_coverage=0.9995, **kw)


def _dirs(root):
    """{name: directory}: SigLIP layouts of the trained models."""
    lines = _corpus()
    out = {}
    _train(os.path.join(root, "t5"), lines, 4000)
    # a second model: byte fallback and user-defined pieces
    _train(os.path.join(root, "bf"), lines[::3], 1500, byte_fallback=True,
           user_defined_symbols=["catdog", "☃", "zebra crossing"])
    # a third without a charsmap (sentencepiece's "identity" rule)
    _train(os.path.join(root, "id"), lines[::3], 1500, normalization_rule_name="identity")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, model in (("spiece", "t5"), ("bytes", "bf")):
            d = os.path.join(root, name)
            SiglipTokenizer(os.path.join(root, model + ".model"),
                            model_max_length=64).save_pretrained(d)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"text_config": {"max_position_embeddings": 64}}, f)
            out[name] = d
        # the same vocabulary as a tokenizer.json (no spiece.model beside it)
        d = os.path.join(root, "json")
        shutil.copytree(out["spiece"], d)
        conv = SpmConverter(SiglipTokenizer(os.path.join(d, "spiece.model"))).converted()
        conv.save(os.path.join(d, "tokenizer.json"))
        os.remove(os.path.join(d, "spiece.model"))
        out["json"] = d
        # both files, the tokenizer.json damaged: SiglipTokenizer reads
        # spiece.model, and so must vitc
        d = os.path.join(root, "both")
        shutil.copytree(out["spiece"], d)
        conv.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer.json")) as f:
            tj = json.load(f)
        for e in tj["model"]["vocab"][3:]:
            e[1] = -e[1]
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(tj, f)
        out["both"] = d
        # so400m-patch14-224's text tower has 16 positions
        d = os.path.join(root, "ctx16")
        shutil.copytree(out["spiece"], d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"text_config": {"max_position_embeddings": 16}}, f)
        out["ctx16"] = d
        # tokenizer_config.json's switches: legacy (the dummy prefix) and
        # do_lower_case
        for name, key in (("nolegacy", "legacy"), ("nolower", "do_lower_case")):
            d = os.path.join(root, name)
            shutil.copytree(out["spiece"], d)
            with open(os.path.join(d, "tokenizer_config.json")) as f:
                tc = json.load(f)
            tc[key] = False
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(tc, f)
            out[name] = d
        # a T5 layout: sentencepiece alone, no SigLIP cleaning
        for name, model in (("t5", "t5"), ("t5id", "id")):
            d = os.path.join(root, name + "dir")
            os.makedirs(d)
            shutil.copy(os.path.join(root, model + ".model"), os.path.join(d, "spiece.model"))
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"tokenizer_class": "T5Tokenizer", "eos_token": "</s>",
                           "pad_token": "<pad>", "model_max_length": 64}, f)
            out[name] = d
    return out


# ---- the strings -------------------------------------------------------------

WORDS = ("a photo of the cat dog on a table with two red apples and blue sky over "
         "mountains river city street at night people walking bicycle car train "
         "painting drawing sketch close-up small large old new bright dark").split()
ACCENTED = "café naïve résumé façade über straße ñandú crème brûlée Ångström Øresund ĳ Œuvre"
CJK = "東京日本語中文汉字한국어写真猫犬の上にあるリンゴ食べ物"
EMOJI = ["😀", "🐱", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "☃", "✨", "🍎"]
FULLWIDTH = "".join(chr(c) for c in range(0xFF01, 0xFF5F)) + "\u3000"
LIGATURES = "ﬁﬂﬀﬃﬄﬅﬆ"
COMPAT = "①②③ ㍻ ㎏ ² ³ ½ ⅓ Ⅻ ™ ℃ K Å ǅ ﹏ ㈱ ︵ ｶﾞ"
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u3000", "\xa0", "\u2028", "\u200b", "\x0b", "\x0c",
          "\x1c", "\x85", "\u2009", "\ufeff"]
CONTROLS = [chr(c) for c in list(range(0, 32)) + [0x7F, 0x80, 0x9F, 0x200E, 0x200F, 0xAD]]
GREEK = ["ΟΔΥΣΣΕΥΣ", "Σ", "ΣΑΣ.", "ΌΣΟΣ'Σ", "σοφός", "ΑΣ Σ Α"]
MISC = ["İstanbul", "ǈ", "ẞ", "ﬀ", "▁", "▁▁x", "x▁", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "e\u0301", "\u0301",
        "٣٤", "עברית", "العربية", "हिन्दी", "ไทย"]
SPECIAL = ("</s>", "<unk>", "<pad>")


def _piece(rng):
    k = rng.randrange(14)
    if k == 0:
        return rng.choice(WORDS).upper() if rng.random() < .3 else rng.choice(WORDS)
    if k == 1:
        w = rng.choice(ACCENTED.split())
        return unicodedata.normalize(rng.choice(("NFC", "NFD", "NFKD")), w)
    if k == 2:
        return "".join(rng.choice(CJK) for _ in range(rng.randrange(1, 6)))
    if k == 3:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randrange(1, 4)))
    if k == 4:
        return "".join(rng.choice(FULLWIDTH) for _ in range(rng.randrange(1, 8)))
    if k == 5:
        return rng.choice(LIGATURES) + rng.choice(WORDS)
    if k == 6:
        return "".join(rng.choice(string.punctuation) for _ in range(rng.randrange(1, 12)))
    if k == 7:
        return "".join(rng.choice(SPACES) for _ in range(rng.randrange(1, 5)))
    if k == 8:
        return str(rng.randrange(10 ** rng.randrange(1, 12)))
    if k == 9:
        return rng.choice(CONTROLS)
    if k == 10:
        return rng.choice(COMPAT.split())
    if k == 11:
        return rng.choice(GREEK)
    if k == 12:
        return rng.choice(MISC)
    return "".join(chr(rng.randrange(0x20, 0x7F)) for _ in range(rng.randrange(1, 10)))


def strings(n, start=1234):
    rng = random.Random(start)
    out = ["", " ", "a", "A photo of a cat.", "a photo of a dog", "test.........", ".??????",
           "hello   world", "   leading", "trailing   ", "x" * 200, "sea_waves", "don't stop",
           "catdog", "zebra crossing", "a ☃ snowman", " ".join(WORDS) * 3]
    while len(out) < n:
        m = rng.choice((1, 2, 3, 5, 8, 13, 30, 60))
        sep = rng.choice(("", " ", " ", " ", "\t", "  "))
        s = sep.join(_piece(rng) for _ in range(m))
        if not any(t in s for t in SPECIAL):
            out.append(s)
    return out


@unittest.skipIf(spm is None, "sentencepiece / transformers are not installed")
class TestSiglipTokenizer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="vitc-siglip-tok-")
        cls.dirs = _dirs(cls.tmp)
        cls.texts = strings(N_STRINGS)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls.ref = AutoTokenizer.from_pretrained(cls.dirs["spiece"])
            cls.expected = np.array(cls.ref(cls.texts, padding="max_length", max_length=64,
                                            truncation=True)["input_ids"], dtype=np.int32)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def _check(self, tok, texts, expected, context=0):
        bad = []
        for s, e in zip(texts, expected):
            got = tok(s, context)
            if not np.array_equal(got, e):
                bad.append((s, list(e), list(got)))
        self.assertFalse(bad, "%d of %d differ; first: %r" % (len(bad), len(texts),
                                                              bad[:1]))

    def test_reference_is_the_slow_siglip_tokenizer(self):
        self.assertIsInstance(self.ref, SiglipTokenizer)
        self.assertEqual(self.expected.shape, (len(self.texts), 64))
        # SigLIP's framing: no bos, ids then </s> (1), padded with </s>
        self.assertEqual(list(self.expected[0]), [1] * 64)
        self.assertTrue((self.expected[:, -1] == 1).all())
        # the strings reach what must be exact: unknown pieces (2),
        # truncation (63 ids + </s>), empty results
        self.assertGreater((self.expected == 2).any(axis=1).sum(), 500)
        self.assertGreater((self.expected[:, 62] != 1).sum(), 500)
        self.assertGreater((self.expected[:, 0] == 1).sum(), 50)

    def test_spiece_model(self):
        tok = vitc.Tokenizer(self.dirs["spiece"])
        self.assertEqual((tok.kind, tok.context, tok.vocab_size),
                         ("sentencepiece-unigram", 64, 4000))
        self._check(tok, self.texts, self.expected)

    def test_tokenizer_json(self):
        tok = vitc.Tokenizer(self.dirs["json"])
        self.assertEqual((tok.context, tok.vocab_size), (64, 4000))
        self._check(tok, self.texts, self.expected)

    def test_spiece_model_beside_tokenizer_json(self):
        self._check(vitc.Tokenizer(self.dirs["both"]), self.texts[:2000], self.expected[:2000])

    def test_spiece_file_alone(self):
        # a bare spiece.model: SigLIP's defaults (cleaning, </s>, 64)
        tok = vitc.Tokenizer(os.path.join(self.dirs["spiece"], "spiece.model"))
        self._check(tok, self.texts[:2000], self.expected[:2000])

    def test_byte_fallback_and_user_defined(self):
        d = self.dirs["bytes"]
        # runs like "777" tie ("7" + "77" = "77" + "7" exactly); the float
        # rounding of the sum before them, which a user-defined piece
        # shifts, breaks the tie
        rng = random.Random(5)
        runs = ["☃ " * rng.randrange(1, 3) + " ".join(rng.choice(WORDS) for _ in
                                                       range(rng.randrange(12)))
                + " " + str(rng.randrange(10)) * rng.randrange(3, 7) for _ in range(1500)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = AutoTokenizer.from_pretrained(d)
            texts = self.texts[:3000] + runs
            exp = ref(texts, padding="max_length", max_length=64, truncation=True)["input_ids"]
        # the byte pieces and the user-defined pieces are in use
        flat = set(np.array(exp).ravel().tolist())
        bytes_ids = set(ref.convert_tokens_to_ids(["<0x%02X>" % b for b in range(256)]))
        self.assertTrue(flat & bytes_ids)
        self.assertIn(ref.convert_tokens_to_ids("☃"), flat)
        self._check(vitc.Tokenizer(d), texts, exp)

    def test_config_switches(self):
        texts = self.texts[:2000]
        for name in ("nolegacy", "nolower"):
            with self.subTest(name), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = AutoTokenizer.from_pretrained(self.dirs[name])
                exp = ref(texts, padding="max_length", max_length=64,
                          truncation=True)["input_ids"]
                # (legacy false: the same ids, the unk-token prefix makes the
                # dummy prefix moot; do_lower_case false: other ids)
                if name == "nolower":
                    self.assertNotEqual(exp, self.expected[:2000].tolist())
                self._check(vitc.Tokenizer(self.dirs[name]), texts, exp)

    def test_more_models(self):
        # Ties between equal sums ("7" + "77" vs "77" + "7") are settled by
        # the float rounding of the running score, which depends on the
        # model: a few more vocabularies, with user-defined pieces (their
        # score shifts every later sum) and byte fallback.
        lines = _corpus()
        texts = [t for t in self.texts[:6000] if len(t) < 400][:1500]
        for k, (vocab, extra) in enumerate(((900, {"byte_fallback": True}), (2500, {}),
                                             (3000, {"byte_fallback": True}))):
            root = os.path.join(self.tmp, "more%d" % k)
            os.makedirs(root, exist_ok=True)
            _train(os.path.join(root, "m"), lines[k::2], vocab,
                   user_defined_symbols=["☃", "catdog", "photo of", "東京"], **extra)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                d = os.path.join(root, "d")
                SiglipTokenizer(os.path.join(root, "m.model")).save_pretrained(d)
                ref = AutoTokenizer.from_pretrained(d)
                exp = ref(texts, padding="max_length", max_length=64,
                          truncation=True)["input_ids"]
            with self.subTest(vocab=vocab):
                self._check(vitc.Tokenizer(d), texts, exp)

    def test_context_from_config(self):
        tok = vitc.Tokenizer(self.dirs["ctx16"])
        self.assertEqual(tok.context, 16)
        texts = self.texts[:1000]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exp = self.ref(texts, padding="max_length", max_length=16,
                           truncation=True)["input_ids"]
        self._check(tok, texts, exp)

    def test_plain_sentencepiece(self):
        for name in ("t5", "t5id"):
            with self.subTest(name):
                self._plain(name)

    def _plain(self, name):
        # not SigLIP: the text as it is, sentencepiece's ids + </s>, <pad>
        tok = vitc.Tokenizer(self.dirs[name])
        sp = spm.SentencePieceProcessor(model_file=os.path.join(self.dirs[name], "spiece.model"))
        # long texts whose end removes what their start leaves open: literal
        # U+2581s are trailing spaces to sentencepiece
        texts = self.texts[:3000] + ["a photo of " * 5 + "\u2581" * 100000,
                                     "a photo of " * 5 + " " * 100000 + "x",
                                     "a photo of " * 5 + "\u2581 " * 50000 + "x"]
        exp = []
        for s in texts:
            ids = sp.encode(s)[:63] + [1]
            exp.append(ids + [0] * (64 - len(ids)))
        self._check(tok, texts, exp)

    def test_user_defined_score(self):
        # sentencepiece 0.2.3 scores a user-defined piece 0.1 per byte past
        # the first: "▁" + "жщ" (-1 + 0.1) beats "▁ж" + "щ" (-0.5 - 0.5);
        # the older -0.1 would not
        from sentencepiece import sentencepiece_model_pb2 as pb
        m = pb.ModelProto()
        for piece, score, kind in (("<pad>", 0, 3), ("</s>", 0, 3), ("<unk>", 0, 2),
                                   ("\u2581", -1.0, 1), ("\u2581ж", -0.5, 1), ("щ", -0.5, 1),
                                   ("жщ", 0, 4), ("a", -2, 1)):
            x = m.pieces.add()
            x.piece, x.score, x.type = piece, score, kind
        m.trainer_spec.unk_id, m.trainer_spec.bos_id = 2, -1
        m.trainer_spec.eos_id, m.trainer_spec.pad_id = 1, 0
        m.normalizer_spec.name = "identity"
        d = os.path.join(self.tmp, "udscore")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "spiece.model"), "wb") as f:
            f.write(m.SerializeToString())
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "T5Tokenizer"}, f)
        sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "spiece.model"))
        self.assertEqual(sp.encode("жщ"), [3, 6])
        tok = vitc.Tokenizer(d)
        for s in ("жщ", "a жщ", "жщжщ a", "ж щ"):
            ids = sp.encode(s) + [1]
            self.assertEqual(list(tok(s, 16)), ids + [0] * (16 - len(ids)), s)

    def test_long_text_stops_early_and_exactly(self):
        rng = random.Random(7)
        texts = [" ".join(_piece(rng) for _ in range(20000)) for _ in range(3)]
        texts.append("a" * 300000)
        texts.append(" ".join(rng.choice(CJK) for _ in range(100000)))
        # what the first pieces of a long text must not decide alone:
        # trailing spaces, combining sequences and a final sigma's context
        # running past them
        texts.append("a photo of " * 3 + " " * 100000)
        texts.append("a photo of " * 3 + " \t" * 50000 + "x")
        texts.append("ab " * 10 + "e\u0301" * 50000 + " z" * 100)
        texts.append("ΟΔΥΣ" + "\u0301" * 5000 + " b" * 100)
        texts.append("ΟΔΥΣ" + "\u0301" * 5000 + "A" + " b" * 100)
        texts.append("x " * 40 + "ﬁ" * 30000)
        tok = vitc.Tokenizer(self.dirs["spiece"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exp = self.ref(texts, padding="max_length", max_length=64,
                           truncation=True)["input_ids"]
        t = time.perf_counter()
        self._check(tok, texts, exp)
        self.assertLess(time.perf_counter() - t, 5.0)

    def test_mutated_model_files(self):
        # hostile files: damaged copies of a real model load or fail with
        # an error, and a loaded one encodes or fails with an error
        with open(os.path.join(self.dirs["spiece"], "spiece.model"), "rb") as f:
            good = f.read()
        d = os.path.join(self.tmp, "mutants")
        os.makedirs(d, exist_ok=True)
        rng = random.Random(99)
        loaded = failed = 0
        for i in range(200):
            b = bytearray(good)
            kind = i % 4
            if kind == 0:
                b = b[:rng.randrange(len(b))]
            elif kind == 1:
                for _ in range(rng.randrange(1, 6)):
                    b[rng.randrange(len(b))] = rng.randrange(256)
            elif kind == 2:
                at = rng.randrange(len(b))
                b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12)))
            else:  # the charsmap's region (near the end of the file)
                for _ in range(rng.randrange(1, 4)):
                    b[len(b) - 1 - rng.randrange(min(len(b), 250000))] = rng.randrange(256)
            path = os.path.join(d, "m%d.model" % i)
            with open(path, "wb") as f:
                f.write(bytes(b))
            try:
                tok = vitc.Tokenizer(path)
            except vitc.VitcError as e:
                self.assertTrue(str(e))
                failed += 1
                continue
            loaded += 1
            for s in self.texts[:20]:
                try:
                    ids = tok(s)
                    self.assertTrue(((ids >= 0) & (ids < tok.vocab_size)).all())
                except vitc.VitcError:
                    pass
        self.assertGreater(failed, 20)
        self.assertGreater(loaded, 20)

    def test_errors(self):
        tok = vitc.Tokenizer(self.dirs["spiece"])
        with self.assertRaises(vitc.VitcError) as cm:
            tok(b"caf\xc3")
        self.assertIn("UTF-8", str(cm.exception))
        # SigLIP 2's Gemma tokenizer is a SentencePiece BPE model
        d = os.path.join(self.tmp, "bpe")
        os.makedirs(d, exist_ok=True)
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(_corpus()[:2000]), model_prefix=os.path.join(d, "spiece"),
            model_type="bpe", vocab_size=500, minloglevel=2)
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.Tokenizer(os.path.join(d, "spiece.model"))
        self.assertIn("Unigram", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
