"""Zero-shot classification and text search (`vitc zero-shot`, `embed
--text`, `similar --text`, `tokenize`, Model.zero_shot) against torch doing
the same recipe: random-weight transformers CLIPModel / SiglipModel saved
with save_pretrained, the real CLIP vocabulary (open_clip's
bpe_simple_vocab_16e6.txt.gz turned into vocab.json + merges.txt), a small
SentencePiece Unigram model trained here for SigLIP, skimage's photos.

The reference: transformers' get_image_features / get_text_features on the
ids of transformers' own tokenizer (SigLIP padded to 64, as its pipeline
pads) and the recipe in float64 numpy (prompts normalised, averaged over the
templates, normalised; CLIP softmax of exp(logit_scale) * cos, SigLIP
sigmoid(exp(logit_scale) * cos + logit_bias)). The images go through vitc's
preprocessing on both sides: the recipe is what is checked here (the
processor is checked in test_hub.py).
"""
import gzip
import json
import os
import subprocess
import sys
import time
import unittest

import numpy as np

try:
    from .util import VITC, TmpDirCase
except ImportError:  # run as a script
    from util import VITC, TmpDirCase

try:
    import torch
    import sentencepiece  # noqa: F401 (the child process trains with it)
    import skimage.data
    from open_clip.tokenizer import bytes_to_unicode, default_bpe
    from PIL import Image
    from transformers import (AutoTokenizer, CLIPConfig, CLIPModel, CLIPTokenizer, SiglipConfig,
                              SiglipModel, SiglipTokenizer)
    HAVE_PEERS = True
except ImportError:  # pragma: no cover
    HAVE_PEERS = False

import vitc

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              image_size=32, patch_size=16)
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
LABELS = ["astronaut", "cup of coffee", "cat", "rocket", "dog on a beach"]
MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def processor(model_type):
    return {"image_processor_type": "CLIPImageProcessor" if model_type == "clip"
            else "SiglipImageProcessor",
            "do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255,
            "do_normalize": True, "image_mean": MEAN, "image_std": STD, "do_convert_rgb": True,
            **({"size": {"shortest_edge": 32}, "do_center_crop": True,
                "crop_size": {"height": 32, "width": 32}} if model_type == "clip"
               else {"size": {"height": 32, "width": 32}})}


def clip_tokenizer_files(d):
    """vocab.json + merges.txt from open_clip's vocabulary (as its
    SimpleTokenizer builds it), then transformers' own save_pretrained."""
    merges = gzip.open(default_bpe()).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    with open(os.path.join(d, "vocab.json"), "w") as f:
        json.dump({v: i for i, v in enumerate(vocab)}, f)
    with open(os.path.join(d, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    CLIPTokenizer(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt")).save_pretrained(d)


def siglip_tokenizer_files(d):
    """A small Unigram spiece.model trained here, in a child process:
    training draws on sentencepiece's process-wide generator, and another
    test's model trained later in this process must stay the same."""
    code = r"""
import io, sys
import sentencepiece as spm
corpus = ["a photo of a cat", "a photo of a dog on a beach", "a bad photo of the car",
          "an astronaut in space", "a cup of coffee on a table", "a rocket on the launch pad",
          "the cartoon plushie toy", "graffiti of a sculpture", "itap of my origami",
          "a large small nice weird cool photo"] * 20
buf = io.BytesIO()
spm.SentencePieceTrainer.train(
    sentence_iterator=iter(corpus), model_writer=buf, vocab_size=120, model_type="unigram",
    pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
    unk_piece="<unk>", hard_vocab_limit=False, minloglevel=2)
open(sys.argv[1], "wb").write(buf.getvalue())
"""
    subprocess.run([sys.executable, "-c", code, os.path.join(d, "spiece.model")], check=True)
    SiglipTokenizer(os.path.join(d, "spiece.model"), model_max_length=64).save_pretrained(d)


def unit(x):
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@unittest.skipUnless(HAVE_PEERS and os.path.exists(VITC),
                     "needs torch, transformers, open_clip, sentencepiece, skimage and build/vitc")
class TestZeroShot(TmpDirCase):
    TMP_PREFIX = "vitc_zs_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        torch.manual_seed(0)
        cls.photos = []
        for name in PHOTOS:
            p = os.path.join(cls.tmp, name + ".png")
            Image.fromarray(getattr(skimage.data, name)()).convert("RGB").save(p)
            cls.photos.append(p)
        cls.clip_dir = os.path.join(cls.tmp, "clip")
        tc = dict(vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, max_position_embeddings=77)
        cls.clip = CLIPModel(CLIPConfig(text_config=tc, vision_config=VISION,
                                        projection_dim=24)).eval()
        with torch.no_grad():
            cls.clip.logit_scale.fill_(float(np.log(100.0)))
        cls.clip.save_pretrained(cls.clip_dir)
        clip_tokenizer_files(cls.clip_dir)
        cls.sig_dir = os.path.join(cls.tmp, "siglip")
        tc = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, max_position_embeddings=64)
        cls.sig = SiglipModel(SiglipConfig(text_config=tc, vision_config=VISION)).eval()
        with torch.no_grad():
            cls.sig.logit_scale.fill_(float(np.log(30.0)))
            cls.sig.logit_bias.fill_(-2.0)
        cls.sig.save_pretrained(cls.sig_dir)
        siglip_tokenizer_files(cls.sig_dir)
        for d, t in ((cls.clip_dir, "clip"), (cls.sig_dir, "siglip")):
            with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
                json.dump(processor(t), f)
        cls.cache = os.path.join(cls.tmp, "cache")
        cls.env = dict(os.environ, XDG_CACHE_HOME=os.path.join(cls.tmp, "xdg"),
                       HOME=os.path.join(cls.tmp, "home"))

    def run_cli(self, *args):
        p = subprocess.run([VITC] + [str(a) for a in args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=self.env, timeout=120)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8",
                                                                                  "replace")

    # ---- the references ------------------------------------------------

    def pixels(self, d):
        m = vitc.load_model(d)
        return torch.from_numpy(np.stack([m.preprocess(p) for p in self.photos]))

    def text_features(self, ref, d, texts, siglip):
        tok = AutoTokenizer.from_pretrained(d)
        enc = tok(texts, padding="max_length", max_length=64, truncation=True) if siglip \
            else tok(texts, padding=True)
        with torch.no_grad():
            out = ref.get_text_features(input_ids=torch.tensor(enc["input_ids"]))
        return getattr(out, "pooler_output", out).double().numpy()

    def image_features(self, ref, d):
        with torch.no_grad():
            out = ref.get_image_features(pixel_values=self.pixels(d))
        return getattr(out, "pooler_output", out).double().numpy()

    def recipe(self, ref, d, labels, templates, siglip):
        """probs [images, labels] in float64."""
        t = self.text_features(ref, d, [tp.replace("{}", lab) for lab in labels
                                        for tp in templates], siglip)
        w = unit(unit(t).reshape(len(labels), len(templates), -1).mean(axis=1))
        z = np.exp(float(ref.logit_scale.detach())) * unit(self.image_features(ref, d)) @ w.T
        if siglip:
            return 1 / (1 + np.exp(-(z + float(ref.logit_bias.detach()))))
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def cli_probs(self, d, labels, *extra):
        rc, out, err = self.run_cli("zero-shot", "--model", d, "--labels", ",".join(labels),
                                    "--top", len(labels), "--json", "--cache", self.cache,
                                    "--quiet", *extra, *self.photos)
        self.assertEqual(rc, 0, err)
        rows = [json.loads(line) for line in out.splitlines()]
        self.assertEqual([r["image"] for r in rows], self.photos)
        probs = np.zeros((len(rows), len(labels)))
        for i, r in enumerate(rows):
            got = [x["prob"] for x in r["labels"]]
            self.assertEqual(got, sorted(got, reverse=True), "most probable first")
            for x in r["labels"]:
                probs[i, labels.index(x["label"])] = x["prob"]
        return probs, err

    # ---- zero-shot -------------------------------------------------------

    def test_clip_probs(self):
        for extra, templates in (((), ["a photo of a {}."]),
                                 (("--templates", "simple"), None),
                                 (("--template", "{} in a {} world"), ["{} in a {} world"])):
            if templates is None:
                from open_clip.zero_shot_metadata import SIMPLE_IMAGENET_TEMPLATES
                templates = [t("{}") for t in SIMPLE_IMAGENET_TEMPLATES]
            got, _ = self.cli_probs(self.clip_dir, LABELS, *extra)
            ref = self.recipe(self.clip, self.clip_dir, LABELS, templates, False)
            np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0, err_msg=str(extra))
            np.testing.assert_allclose(got.sum(axis=1), 1, atol=1e-5)

    def test_siglip_probs(self):
        got, _ = self.cli_probs(self.sig_dir, LABELS)
        ref = self.recipe(self.sig, self.sig_dir, LABELS, ["a photo of a {}."], True)
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
        # independent sigmoids: they need not sum to 1
        self.assertGreater(abs(got.sum(axis=1) - 1).max(), 1e-3)

    def test_templates_imagenet80(self):
        from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES
        n = __import__("ctypes").c_int()
        arr = vitc._lib.lib.vitc_zero_shot_templates(b"imagenet80", __import__("ctypes").byref(n))
        self.assertEqual([arr[i].decode() for i in range(n.value)],
                         [t("{}") for t in OPENAI_IMAGENET_TEMPLATES])

    def test_cache_hit(self):
        """A second call with the same model, templates and labels reads the
        class embeddings: no text tower (the --verbose line), the same output;
        another label set computes again."""
        labels = ["label%d" % i for i in range(40)]
        cache = os.path.join(self.tmp, "cache_hit")
        args = ["zero-shot", "--model", self.clip_dir, "--labels", ",".join(labels), "--templates",
                "imagenet80", "--json", "--verbose", "--quiet", "--cache", cache, self.photos[0]]
        rc, out1, err1 = self.run_cli(*args)
        self.assertEqual(rc, 0, err1)
        self.assertIn("class embeddings: computed (40 labels x 80 templates)", err1)
        files = os.listdir(cache)
        self.assertEqual(len(files), 1, files)
        self.assertEqual(os.stat(cache).st_mode & 0o777, 0o700)
        rc, out2, err2 = self.run_cli(*args)
        self.assertEqual(rc, 0, err2)
        self.assertIn("class embeddings: cached", err2)
        self.assertEqual(out1, out2)
        rc, _, err3 = self.run_cli(*(args[:4] + [",".join(labels[1:])] + args[5:]))
        self.assertIn("class embeddings: computed", err3)
        # the default folder: $XDG_CACHE_HOME/vitc/zero-shot
        rc, _, err = self.run_cli("zero-shot", "--model", self.sig_dir, "--labels", "a,b",
                                  "--quiet", self.photos[0])
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(os.listdir(os.path.join(self.env["XDG_CACHE_HOME"], "vitc",
                                                      "zero-shot"))), 1)
        # a link planted under the cache's name is replaced, never written through
        victim = os.path.join(self.tmp, "victim")
        with open(victim, "w") as f:
            f.write("keep")
        target = os.path.join(cache, files[0])
        os.remove(target)
        os.symlink(victim, target)
        rc, _, err = self.run_cli(*args)
        self.assertEqual(rc, 0, err)
        self.assertFalse(os.path.islink(target))
        with open(victim) as f:
            self.assertEqual(f.read(), "keep")
        # the tokenizer is part of the key: merges.txt touched, computed again
        rc, _, err = self.run_cli(*args)
        self.assertIn("class embeddings: cached", err)
        merges = os.path.join(self.clip_dir, "merges.txt")
        st = os.stat(merges)
        os.utime(merges, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        rc, _, err = self.run_cli(*args)
        self.assertEqual(rc, 0, err)
        self.assertIn("class embeddings: computed", err)

    def test_text_output(self):
        rc, out, err = self.run_cli("zero-shot", "--model", self.clip_dir, "--labels",
                                    "cat, dog", "--no-cache", "--quiet", self.photos[2])
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual(lines[0], self.photos[2])
        self.assertEqual(len(lines), 3)
        self.assertEqual(sorted(l.split()[-1] for l in lines[1:]), ["cat", "dog"])
        # a labels file with CRLF and no last newline reads as --labels; an
        # image that cannot be read is reported, the others still labelled
        lf = self.path("crlf.txt")
        with open(lf, "wb") as f:
            f.write(b"cat\r\ndog")
        rc2, out2, err2 = self.run_cli("zero-shot", "--model", self.clip_dir, "--labels-file", lf,
                                       "--no-cache", "--quiet", self.path("missing.png"),
                                       self.photos[2])
        self.assertEqual(rc2, 1)
        self.assertEqual(out2, out)
        self.assertIn("missing.png", err2)

    def test_python_zero_shot(self):
        m = vitc.load_model(self.clip_dir)
        got = m.zero_shot(self.photos, LABELS, templates="simple", top=3)
        ref, _ = self.cli_probs(self.clip_dir, LABELS, "--templates", "simple")
        self.assertEqual(len(got), len(self.photos))
        for i, row in enumerate(got):
            self.assertEqual(len(row), 3)
            order = np.argsort(-ref[i], kind="stable")[:3]
            self.assertEqual([lab for lab, _ in row], [LABELS[k] for k in order])
            np.testing.assert_allclose([p for _, p in row], ref[i][order], atol=1e-6)
        # preprocessed arrays and a template list
        x = np.stack([m.preprocess(p) for p in self.photos])
        a = m.zero_shot(x, LABELS, templates=["itap of a {}."])
        b = m.zero_shot(self.photos, LABELS, templates="itap of a {}.")
        self.assertEqual(a, b)
        s = vitc.load_model(self.sig_dir)
        ref = self.recipe(self.sig, self.sig_dir, LABELS, ["a photo of a {}."], True)
        for i, row in enumerate(s.zero_shot(self.photos, LABELS)):
            np.testing.assert_allclose([p for _, p in row],
                                       [ref[i][LABELS.index(lab)] for lab, _ in row], atol=1e-5)
        # the label set's class embeddings are kept: a second call does not
        # run the text tower
        calls = []
        enc = m.encode_text
        m.encode_text = lambda t: calls.append(len(t)) or enc(t)
        m.zero_shot(self.photos[:1], LABELS, templates=["itap of a {}."])
        self.assertEqual(calls, [])
        m.zero_shot(self.photos[:1], LABELS[:2], templates=["itap of a {}."])
        self.assertEqual(calls[:1], [2])  # (strings, then their ids)
        del m.encode_text
        with self.assertRaises(ValueError):
            m.zero_shot(self.photos, ["cat", ""])
        with self.assertRaises(ValueError):
            m.zero_shot(self.photos, ["cat"], templates=["no slot"])

    # ---- embed --text, similar --text, tokenize --------------------------

    def test_embed_text(self):
        texts = ["a dog on a beach", "An Astronaut!", "café au lait ☕"]
        tf = self.path("texts.txt")
        with open(tf, "w", encoding="utf-8") as f:
            f.write("\n".join(texts) + "\n")
        for d, ref, sig in ((self.clip_dir, self.clip, False), (self.sig_dir, self.sig, True)):
            want = self.text_features(ref, d, texts, sig)
            rc, out, err = self.run_cli("embed", "--model", d, "--text-file", tf, "--quiet")
            self.assertEqual(rc, 0, err)
            rows = [json.loads(line) for line in out.splitlines()]
            self.assertEqual([r["text"] for r in rows], texts)
            got = np.array([r["embedding"] for r in rows])
            self.assertLess(np.abs(got - want).max() / np.abs(want).max(), 1e-5, d)
            npy = self.path("t.npy")
            rc, _, err = self.run_cli("embed", "--model", d, "--text", texts[0], "--normalize",
                                      "--out", npy, "--quiet")
            self.assertEqual(rc, 0, err)
            np.testing.assert_allclose(np.load(npy)[0], unit(want[0]), atol=1e-5)

    def test_similar_text(self):
        index = self.path("index")
        os.makedirs(index, exist_ok=True)
        for p in self.photos:
            os.link(p, os.path.join(index, os.path.basename(p)))
        names = sorted(os.path.basename(p) for p in self.photos)
        query = "a photo of a rocket"
        for d, ref, sig in ((self.clip_dir, self.clip, False), (self.sig_dir, self.sig, True)):
            rc, out, err = self.run_cli("similar", "--model", d, "--index", index, "--text",
                                        query, "--json", "--topk", 10, "--quiet",
                                        "--cache", self.path("sim_cache"))
            self.assertEqual(rc, 0, err)
            rows = [json.loads(line) for line in out.splitlines()]
            # torch: the images in the folder's (sorted) order
            with torch.no_grad():
                m = vitc.load_model(d)
                px = torch.from_numpy(np.stack([m.preprocess(os.path.join(index, n))
                                                for n in names]))
                img = getattr(ref.get_image_features(pixel_values=px), "pooler_output", None)
                img = (img if img is not None else ref.get_image_features(pixel_values=px))
            cos = unit(img.double().numpy()) @ unit(self.text_features(ref, d, [query], sig)[0])
            order = np.argsort(-cos, kind="stable")
            self.assertEqual([os.path.basename(r["image"]) for r in rows],
                             [names[i] for i in order])
            np.testing.assert_allclose([r["score"] for r in rows], cos[order], atol=1e-5)

    def test_tokenize(self):
        texts = ["a photo of a cat.", "Hello,   WORLD!!  naïve café"]
        for d in (self.clip_dir, self.sig_dir):
            tok = AutoTokenizer.from_pretrained(d)
            rc, out, err = self.run_cli("tokenize", "--model", d, "--json", *texts)
            self.assertEqual(rc, 0, err)
            for line, t in zip(out.splitlines(), texts):
                r = json.loads(line)
                want = tok(t)["input_ids"]
                self.assertEqual(r["text"], t)
                self.assertEqual(r["ids"][:r["n"]], want, d)

    # ---- bad input: one line, exit 1 or 2, nothing written ---------------

    def assert_refused(self, args, needle, d=None, timeout_s=20):
        cache = self.path("bad_cache")
        t0 = time.monotonic()
        rc, out, err = self.run_cli("zero-shot", "--model", d or self.clip_dir, "--cache", cache,
                                    "--quiet", *args, self.photos[0])
        self.assertLess(time.monotonic() - t0, timeout_s, args)
        self.assertIn(rc, (1, 2), err)
        self.assertEqual(out, "")
        lines = [line for line in err.splitlines() if not line.startswith("Try ")]
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("vitc: error: "), err)
        self.assertIn(needle, lines[0])
        self.assertFalse(os.path.exists(cache) and os.listdir(cache), "nothing written")

    def test_bad_input(self):
        lf = self.path("bad_utf8.txt")
        with open(lf, "wb") as f:
            f.write(b"cat\ndo\xc3g\n")
        self.assert_refused(["--labels-file", lf], "line 2 is not valid UTF-8 at byte offset 2")
        self.assert_refused(["--labels", "cat,\xff".encode("latin-1").decode("utf-8",
                                                                                "surrogateescape")],
                            "byte offset 0")
        big = self.path("big_label.txt")
        with open(big, "w") as f:
            f.write("cat\n" + "x" * (1 << 20) + "\n")
        self.assert_refused(["--labels-file", big], "line 2 is 1048576 bytes; the limit is 4096")
        many = self.path("many.txt")
        with open(many, "w") as f:
            f.write("".join("label %d\n" % i for i in range(100000)))
        self.assert_refused(["--labels-file", many], "the limit is 50000")
        self.assert_refused(["--labels", "cat,,dog"], "label 2 is empty")
        self.assert_refused(["--labels", "cat, "], "label 2 is empty")
        blank = self.path("blank.txt")
        with open(blank, "w") as f:
            f.write("cat\n\ndog\n")
        self.assert_refused(["--labels-file", blank], "line 2 is empty")
        self.assert_refused(["--labels", "cat", "--template", "a photo"], "has no {}")
        self.assert_refused(["--labels", "cat", "--templates", "fancy"], "imagenet80 or simple")
        # a Hub directory with the vision tower only
        vis = self.path("vision_only")
        if not os.path.exists(vis):
            from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection
            CLIPVisionModelWithProjection(CLIPVisionConfig(**VISION, projection_dim=24)) \
                .save_pretrained(vis)
            with open(os.path.join(vis, "preprocessor_config.json"), "w") as f:
                json.dump(processor("clip"), f)
        self.assert_refused(["--labels", "cat"], "has no text tower", d=vis)
        # both towers, no tokenizer files
        notok = self.path("no_tokenizer")
        if not os.path.exists(notok):
            os.makedirs(notok)
            for n in ("config.json", "model.safetensors", "preprocessor_config.json"):
                os.link(os.path.join(self.clip_dir, n), os.path.join(notok, n))
        self.assert_refused(["--labels", "cat"], "tokenizer.json", d=notok)
        rc, _, err = self.run_cli("embed", "--model", vis, "--text", "cat")
        self.assertEqual(rc, 1)
        self.assertIn("has no text tower", err)
        rc, _, err = self.run_cli("similar", "--model", notok, "--index", self.tmp, "--text", "x",
                                  "--no-cache")
        self.assertEqual(rc, 1)
        self.assertIn("tokenizer.json", err)


if __name__ == "__main__":
    unittest.main()
