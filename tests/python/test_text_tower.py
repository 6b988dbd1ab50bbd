"""The text towers of CLIP and SigLIP checkpoints against the real code:
transformers 5's CLIPModel / SiglipModel get_text_features and open_clip's
CLIP.encode_text, random weights from small configs saved as their own
layouts (save_pretrained; open_clip's state_dict + open_clip_config.json),
token ids from open_clip's tokenizer (the real CLIP vocabulary) or random
valid ids. Features within 1e-5 relative (max|d| / max|ref|); the pooling
rules (first end-of-text id, the legacy eos_token_id 2's argmax, SigLIP's
last position over its padding); logit_scale / logit_bias; the session and
the model API alike; vision-only, text-only, incomplete checkpoints; bad
arguments.
"""
import ctypes
import json
import os
import shutil
import tempfile
import unittest

import numpy as np
import torch

import vitc
from vitc._lib import lib

try:
    import open_clip
    from safetensors.torch import load_file, save_file
    from transformers import (CLIPConfig, CLIPModel, CLIPVisionConfig,
                              CLIPVisionModelWithProjection, CLIPTextConfig,
                              CLIPTextModelWithProjection, SiglipConfig, SiglipModel)
    HAVE_PEERS = True
except ImportError:  # pragma: no cover
    HAVE_PEERS = False

CAPTIONS = ["a photo of a cat", "a diagram",
            "two dogs playing on a beach at sunset with a red frisbee flying over the waves",
            "x", "an extremely long caption " * 20]
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              image_size=32, patch_size=16)


def rel(a, ref):
    return float(np.abs(np.asarray(a) - np.asarray(ref)).max() / np.abs(np.asarray(ref)).max())


def feats(out):
    return (out.pooler_output if hasattr(out, "pooler_output") else out).detach().numpy()


def clip_ids(texts):
    """CLIP ids of the real vocabulary (open_clip's tokenizer), padded with 0."""
    return open_clip.tokenize(texts).numpy().astype(np.int32)


def random_scales(model, bias=False):
    with torch.no_grad():
        model.logit_scale.fill_(2.3)
        if bias:
            model.logit_bias.fill_(-7.5)


@unittest.skipUnless(HAVE_PEERS, "transformers, open_clip and safetensors needed")
class TextTowerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="vitc_text_")
        torch.manual_seed(0)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def save_clip(self, name, act="quick_gelu", eos=None, layers=2):
        tc = dict(vocab_size=49408, hidden_size=64, intermediate_size=256,
                  num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=77,
                  hidden_act=act)
        if eos is not None:
            tc["eos_token_id"] = eos
        m = CLIPModel(CLIPConfig(text_config=tc, vision_config=VISION, projection_dim=48)).eval()
        random_scales(m)
        path = os.path.join(self.tmp, name)
        m.save_pretrained(path)
        return m, path

    def check_clip(self, act):
        ref_m, path = self.save_clip("clip_" + act, act)
        m = vitc.load_model(path)
        self.assertTrue(m.has_text)
        self.assertEqual((m.text_dim, m.text_context), (48, 77))
        self.assertIsNone(m.logit_bias)
        self.assertAlmostEqual(m.logit_scale, float(ref_m.logit_scale.detach().exp()), delta=1e-5 * 10)
        ids = clip_ids(CAPTIONS)
        with torch.no_grad():
            ref = feats(ref_m.get_text_features(input_ids=torch.from_numpy(ids).long()))
        out = m.encode_text(ids)
        self.assertEqual(out.shape, (len(CAPTIONS), 48))
        self.assertLess(rel(out, ref), 1e-5)
        # padding after the end-of-text id changes nothing (causal mask): 0, EOS or any id
        eos_pad = ids.copy()
        rng = np.random.default_rng(1)
        for b in range(len(ids)):
            e = int(np.argmax(ids[b] == 49407))
            eos_pad[b, e + 1:] = 49407 if b % 2 else rng.integers(0, 49406, 76 - e)
        self.assertLess(rel(m.encode_text(eos_pad), ref), 1e-5)
        # each row alone, cut right after its end-of-text id: the same features
        for b in range(len(ids)):
            e = int(np.argmax(ids[b] == 49407))
            self.assertLess(rel(m.encode_text(ids[b:b + 1, :e + 1]), ref[b:b + 1]), 1e-5)
        return m, ref_m, ids

    def test_clip_quick_gelu(self):
        m, _, ids = self.check_clip("quick_gelu")
        # the session path (m.encode_text) and the model API agree exactly
        out = np.empty((len(ids), m.text_dim), np.float32)
        rc = lib.vitc_vit_encode_text_ids(m._h, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                          len(ids), ids.shape[1],
                                          out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        self.assertEqual(rc, 0)
        np.testing.assert_array_equal(out, m.encode_text(ids))

    def test_clip_gelu(self):
        self.check_clip("gelu")

    def test_clip_pooling_rules(self):
        """Rows without any end-of-text id: transformers pools position 0
        (first EOS) and, with the legacy eos_token_id 2, the largest id."""
        rng = np.random.default_rng(2)
        ids = rng.integers(0, 49407, (3, 20)).astype(np.int32)  # no 49407 anywhere
        for eos in (None, 2):
            ref_m, path = self.save_clip("clip_eos%s" % eos, eos=eos, layers=1)
            with torch.no_grad():
                ref = feats(ref_m.get_text_features(input_ids=torch.from_numpy(ids).long()))
            self.assertLess(rel(vitc.load_model(path).encode_text(ids), ref), 1e-5, eos)

    def test_siglip(self):
        tc = dict(vocab_size=1000, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=64)
        ref_m = SiglipModel(SiglipConfig(text_config=tc, vision_config=VISION)).eval()
        random_scales(ref_m, bias=True)
        path = os.path.join(self.tmp, "siglip")
        ref_m.save_pretrained(path)
        m = vitc.load_model(path)
        self.assertEqual((m.has_text, m.text_dim, m.text_context), (True, 64, 64))
        self.assertAlmostEqual(m.logit_scale, float(ref_m.logit_scale.detach().exp()), delta=1e-4)
        self.assertAlmostEqual(m.logit_bias, -7.5, places=6)
        rng = np.random.default_rng(3)
        ids = rng.integers(2, 1000, (4, 64)).astype(np.int32)
        for b, n in enumerate((3, 10, 40, 64)):
            ids[b, n - 1] = 1  # "</s>" then the pad id 1, as SigLIP's tokenizer pads
            ids[b, n:] = 1
        with torch.no_grad():
            ref = feats(ref_m.get_text_features(input_ids=torch.from_numpy(ids).long()))
        out = m.encode_text(ids)
        self.assertLess(rel(out, ref), 1e-5)
        # the padding is read: fewer pads, other features (as transformers)
        with torch.no_grad():
            ref16 = feats(ref_m.get_text_features(input_ids=torch.from_numpy(ids[:2, :16]).long()))
        out16 = m.encode_text(ids[:2, :16])
        self.assertLess(rel(out16, ref16), 1e-5)
        self.assertGreater(rel(out16, out[:2]), 1e-3)

    def save_open_clip(self, quick, heads=4):
        cfg = dict(embed_dim=40, quick_gelu=quick,
                   vision_cfg=dict(image_size=32, layers=1, width=64, patch_size=16, head_width=32),
                   text_cfg=dict(context_length=77, vocab_size=49408, width=64, heads=heads,
                                 layers=2))
        om = open_clip.CLIP(**cfg).eval()
        with torch.no_grad():
            om.logit_scale.fill_(3.1)
        d = os.path.join(self.tmp, "oc_%d_%d" % (quick, heads))
        os.makedirs(d, exist_ok=True)
        save_file({k: v.contiguous() for k, v in om.state_dict().items()},
                  os.path.join(d, "open_clip_model.safetensors"))
        with open(os.path.join(d, "open_clip_config.json"), "w") as f:
            json.dump({"model_cfg": cfg, "preprocess_cfg": {}}, f)
        return om, d

    def test_open_clip(self):
        ids = clip_ids(CAPTIONS)
        for quick in (False, True):
            om, d = self.save_open_clip(quick)
            with torch.no_grad():
                ref = om.encode_text(torch.from_numpy(ids).long()).numpy()
            for path in (d, os.path.join(d, "open_clip_model.safetensors")):
                m = vitc.load_model(path)
                self.assertEqual((m.has_text, m.text_dim), (True, 40))
                self.assertAlmostEqual(m.logit_scale, float(np.exp(np.float32(3.1))), places=4)
                self.assertLess(rel(m.encode_text(ids), ref), 1e-5, (quick, path))
        # a lone file without open_clip_config.json: OpenAI's choices (QuickGELU,
        # width / 64 heads)
        om, d = self.save_open_clip(True, heads=1)
        lone = os.path.join(self.tmp, "lone")
        os.makedirs(lone, exist_ok=True)
        shutil.copy(os.path.join(d, "open_clip_model.safetensors"), os.path.join(lone, "m.safetensors"))
        with torch.no_grad():
            ref = om.encode_text(torch.from_numpy(ids).long()).numpy()
        self.assertLess(rel(vitc.load_model(os.path.join(lone, "m.safetensors")).encode_text(ids),
                            ref), 1e-5)

    def test_threads(self):
        """Threads sharing one model (a session each) give the serial numbers."""
        import threading
        _, path = self.save_clip("clip_threads", layers=1)
        m = vitc.load_model(path)
        ids = clip_ids(CAPTIONS)
        want = [m.encode_text(ids[i:i + 2]) for i in range(4)]
        got, errs = {}, []

        def work(i):
            try:
                for _ in range(5):
                    got[i] = m.encode_text(ids[i:i + 2])
            except Exception as e:  # pragma: no cover
                errs.append(e)
        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errs, [])
        for i in range(4):
            np.testing.assert_array_equal(got[i], want[i])

    def test_precisions(self):
        """bf16 / int8 models run their text tower at their precision too."""
        ref_m, path = self.save_clip("clip_prec", layers=1)
        ids = clip_ids(CAPTIONS[:3])
        with torch.no_grad():
            ref = feats(ref_m.get_text_features(input_ids=torch.from_numpy(ids).long()))
        for prec, tol in (("bf16", 3e-2), ("int8", 8e-2)):
            m = vitc.load_model(path, precision=prec)
            e = rel(m.encode_text(ids), ref)
            self.assertLess(e, tol, prec)
            self.assertGreater(e, 1e-7, prec)  # not the fp32 numbers
            m.precision = "fp32"
            self.assertLess(rel(m.encode_text(ids), ref), 1e-5, prec)

    def test_vision_only_and_text_only(self):
        vm = CLIPVisionModelWithProjection(CLIPVisionConfig(**VISION, projection_dim=16)).eval()
        vpath = os.path.join(self.tmp, "vision_only")
        vm.save_pretrained(vpath)
        m = vitc.load_model(vpath)
        self.assertEqual((m.has_text, m.text_dim, m.text_context), (False, 0, 0))
        self.assertIsNone(m.tokenizer)
        with self.assertRaisesRegex(vitc.VitcError, "no text tower"):
            m.encode_text(np.zeros((1, 5), np.int32))
        with self.assertRaisesRegex(vitc.VitcError, "no text tower"):
            m.encode_text(["a cat"])
        with self.assertRaisesRegex(vitc.VitcError, "no text tower"):
            m.logit_scale
        tm = CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, projection_dim=16)).eval()
        tpath = os.path.join(self.tmp, "text_only")
        tm.save_pretrained(tpath)
        with self.assertRaisesRegex(vitc.VitcError, "text tower alone") as cm:
            vitc.load_model(tpath)
        self.assertNotIn("\n", str(cm.exception))

    def test_incomplete_text_tower(self):
        _, path = self.save_clip("clip_full", layers=1)
        sd = load_file(os.path.join(path, "model.safetensors"))
        cases = {
            "missing": ("text_model.encoder.layers.0.mlp.fc2.bias", None),
            "shape": ("text_model.final_layer_norm.weight", torch.zeros(63)),
            "scale": ("logit_scale", None),
        }
        for case, (name, value) in cases.items():
            d = os.path.join(self.tmp, "broken_" + case)
            shutil.copytree(path, d, dirs_exist_ok=True)
            bad = dict(sd)
            if value is None:
                del bad[name]
            else:
                bad[name] = value
            save_file(bad, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
            with self.assertRaisesRegex(vitc.VitcError, name.replace(".", r"\.")) as cm:
                vitc.load_model(d)
            self.assertNotIn("\n", str(cm.exception), case)

    def test_tokenizer(self):
        """No tokenizer files: ids still work and text fails naming the
        files; a tokenizer that is there gives the ids transformers' does."""
        ref_m, path = self.save_clip("clip_tok", layers=1)
        m = vitc.load_model(path)
        self.assertIsNone(m.tokenizer)
        with self.assertRaisesRegex(vitc.VitcError, "tokenizer.json"):
            m.encode_text(["a cat"])
        d = os.path.join(self.tmp, "clip_tok_files")
        shutil.copytree(path, d, dirs_exist_ok=True)
        gz = os.path.join(os.path.dirname(open_clip.__file__), "bpe_simple_vocab_16e6.txt.gz")
        shutil.copy(gz, d)
        m = vitc.load_model(d)  # a tokenizer that does not load leaves the model usable
        ids = clip_ids(CAPTIONS)
        with torch.no_grad():
            ref = feats(ref_m.get_text_features(input_ids=torch.from_numpy(ids).long()))
        self.assertLess(rel(m.encode_text(ids), ref), 1e-5)
        if m.tokenizer is None:
            with self.assertRaisesRegex(vitc.VitcError, "tokenizer did not load"):
                m.encode_text(["a cat"])
            return
        np.testing.assert_array_equal(m.tokenize(CAPTIONS), ids)
        self.assertLess(rel(m.encode_text(CAPTIONS), ref), 1e-5)

    def test_bad_arguments(self):
        _, path = self.save_clip("clip_args", layers=1)
        m = vitc.load_model(path)
        I32, F32 = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)
        out = np.empty((4, 48), np.float32)

        def call(ids, B, L, session=False):
            ids = np.ascontiguousarray(ids, np.int32)
            f = lib.vitc_session_encode_text_ids if session else lib.vitc_vit_encode_text_ids
            h = m._session() if session else m._h
            rc = f(h, ids.ctypes.data_as(I32), B, L, out.ctypes.data_as(F32))
            return rc, lib.vitc_last_error().decode()

        good = clip_ids(["a cat", "a dog"])
        for session in (False, True):
            bad = good.copy()
            bad[1, 3] = 49408
            rc, msg = call(bad, 2, 77, session)
            self.assertEqual(rc, vitc.Status.ERR_INVALID_ARG)
            self.assertIn("49408", msg)
            bad[1, 3] = -1
            rc, msg = call(bad, 2, 77, session)
            self.assertIn("id -1", msg)
            rc, msg = call(np.zeros((1, 78)), 1, 78, session)
            self.assertEqual(rc, vitc.Status.ERR_INVALID_ARG)
            self.assertIn("77", msg)
            for B in (0, -1):
                rc, msg = call(good, B, 77, session)
                self.assertEqual(rc, vitc.Status.ERR_INVALID_ARG)
                self.assertIn("batch", msg)
            rc, msg = call(good, 2, 0, session)
            self.assertEqual(rc, vitc.Status.ERR_INVALID_ARG)
        self.assertEqual(lib.vitc_vit_encode_text_ids(None, None, 1, 1, None),
                         vitc.Status.ERR_INVALID_ARG)
        self.assertEqual(lib.vitc_session_encode_text_ids(None, None, 1, 1, None),
                         vitc.Status.ERR_INVALID_ARG)
        with self.assertRaises(vitc.VitcError):
            m.encode_text(np.full((1, 5), 50000))


if __name__ == "__main__":
    unittest.main()
