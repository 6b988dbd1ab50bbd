"""vitc_vit_reset_head (Model.reset_head): a fresh classification head in
each family's own classifier layout, every other weight kept. Checked per
family against an independent float64 computation of the layout's logits
from the model's own features and the new head's weights, against timm's
reset_classifier (its VisionTransformer with vitc's head copied in), and
through save -> load for the families vitc_vit_save writes.

Needs torch, timm and transformers (the .venv that scripts/install-deps.sh
makes); skipped without.
"""
import json
import os
import unittest
import warnings

import numpy as np

import vitc

try:
    from .util import (PHOTO, TmpDirCase, assert_close as close, random_images,
                       reference_modules, run_vitc, torch)
except ImportError:  # run as a script
    from util import (PHOTO, TmpDirCase, assert_close as close, random_images, reference_modules,
                      run_vitc, torch)
try:
    import timm
except ImportError:  # pragma: no cover
    timm = None
hf_ref, st_write, t2t_ref = reference_modules("hf_ref", "st_write", "t2t_ref")


def f64(a):
    return np.asarray(a, np.float64)


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


@unittest.skipIf(torch is None or timm is None, "needs torch and timm")
class TestResetHead(TmpDirCase):
    TMP_PREFIX = "vitc_reset_head_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        gen = torch.Generator().manual_seed(5)
        cls.x = random_images(gen, [(32, 32)])[(32, 32)].numpy()
        cls.xd = random_images(gen, [(42, 42)])[(42, 42)].numpy()

    def round_trip(self, m, x, name):
        """save -> load gives the same logits, labels and head."""
        path = os.path.join(self.tmp, name + ".safetensors")
        m.save(path)
        m2 = vitc.load_model(path)
        self.assertEqual(m2.config["num_classes"], m.config["num_classes"])
        self.assertEqual(m2.labels, m.labels)
        np.testing.assert_array_equal(m2(x), m(x))
        return m2

    def test_torchvision_zero_head_round_trip(self):
        m = vitc.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=3,
                                   hidden_dim=48, mlp_dim=96, num_classes=10, seed=1)
        before = m.state_dict()
        m.reset_head(4, labels=["a", "b", "c", "d"], seed=7)
        self.assertEqual(m.config["num_classes"], 4)
        self.assertEqual(m.labels, ["a", "b", "c", "d"])
        sd = m.state_dict()
        # VisionTransformer.__init__ zeroes heads.head: logits are zeros
        self.assertEqual(sd["heads.head.weight"].shape, (4, 48))
        self.assertFalse(sd["heads.head.weight"].any() or sd["heads.head.bias"].any())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the head is all zeros": what is tested here
            np.testing.assert_array_equal(m(self.x), np.zeros((2, 4), np.float32))
        for k, v in before.items():
            if not k.startswith("heads."):
                np.testing.assert_array_equal(sd[k], v, err_msg=k)
        # a trained head: logits of the layout, then the file round trip
        g = np.random.default_rng(0)
        m.load_state_dict({"heads.head.weight": g.standard_normal((4, 48)).astype(np.float32),
                           "heads.head.bias": g.standard_normal(4).astype(np.float32)},
                          strict=False)
        self.round_trip(m, self.x, "tv")

    def test_timm_matches_reset_classifier(self):
        tm = timm.models.vision_transformer.VisionTransformer(
            img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0,
            num_classes=7).eval()
        from vitc.io import save_safetensors
        path = os.path.join(self.tmp, "timm.safetensors")
        save_safetensors(path, {k: v.detach().numpy() for k, v in tm.state_dict().items()},
                         {"vitc.config": json.dumps({"num_heads": 3})})
        m = vitc.load_model(path)
        self.assertEqual(m.config["family"], "timm")
        m.reset_head(5, seed=3)
        sd = m.state_dict()
        w, b = sd["head.weight"], sd["head.bias"]
        self.assertEqual(w.shape, (5, 48))
        # nn.Linear's default: U(-1/sqrt(48), 1/sqrt(48)), bias too, not zeros
        bound = 48 ** -0.5
        self.assertTrue(np.abs(w).max() <= bound and np.abs(b).max() <= bound)
        self.assertTrue(w.std() > bound / 4 and b.any())
        tm.reset_classifier(5)
        with torch.no_grad():
            tm.head.weight.copy_(torch.from_numpy(w))
            tm.head.bias.copy_(torch.from_numpy(b))
            ref = tm(torch.from_numpy(self.x)).numpy()
        close(self, m(self.x), ref, "timm reset_classifier logits")
        # the same seed draws the same head; another seed another one
        m.reset_head(5, seed=3)
        np.testing.assert_array_equal(m.state_dict()["head.weight"], w)
        m.reset_head(5, labels=["l%d" % i for i in range(5)], seed=4)
        self.assertFalse(np.array_equal(m.state_dict()["head.weight"], w))
        self.round_trip(m, self.x, "timm")
        # a model loaded packed (bf16: its row-major pages given back) resets
        # from its unpacked weights: the same head, logits within bf16's error
        mb = vitc.load_model(path, precision="bf16")
        mb.reset_head(5, labels=["l%d" % i for i in range(5)], seed=4)
        np.testing.assert_array_equal(mb.state_dict()["head.weight"],
                                      m.state_dict()["head.weight"])
        close(self, mb(self.x), m(self.x), "bf16-loaded model after reset_head", tol=5e-2)
        # the saved file is one `vitc classify` reads, with the new labels
        rc, out, err = run_vitc("classify", "--model", os.path.join(self.tmp, "timm.safetensors"),
                                "--json", "--topk", 5, "--quiet", PHOTO)
        self.assertEqual(rc, 0, err)
        got = json.loads(out)
        got = got[0] if isinstance(got, list) else got
        self.assertEqual(sorted(e["label"] for e in got["topk"]), ["l%d" % i for i in range(5)])

    def hub(self, name, cfg, seed=0):
        sd = hf_ref.random_state(cfg, seed)
        d = os.path.join(self.tmp, name)
        hf_ref.save_hub(d, sd, cfg)
        return vitc.load_model(d)

    def test_hf_vit_model_to_classifier(self):
        m = self.hub("vit", hf_ref.vit_config("vit", "ViTModel"))
        self.assertFalse(m.config["has_head"])
        cls = m.embed(self.x)  # the final-normed class token
        m.reset_head(6, seed=2)
        self.assertTrue(m.config["has_head"])
        sd = m.state_dict()
        w, b = sd["heads.head.weight"], sd["heads.head.bias"]
        self.assertEqual(w.shape, (6, 48))
        self.assertFalse(b.any())  # HF's _init_weights: normal_(0, 0.02), bias zeros
        self.assertLess(abs(float(w.std()) - 0.02), 0.006)
        close(self, m(self.x), f64(cls) @ f64(w).T + b, "ViTForImageClassification logits")

    def test_hub_families_save_and_load(self):
        """A Hub model saved (vitc.family beside vitc.config) loads back as the
        same model: family, processor, logits or embeddings."""
        x = self.x
        m = self.hub("vit_rt", hf_ref.vit_config("vit", "ViTModel"))
        m.reset_head(6, labels=list("abcdef"), seed=2)
        m2 = self.round_trip(m, x, "hf_vit")
        self.assertEqual(m2.config["family"], "hf-vit")
        from vitc.image import load_image
        img = load_image(PHOTO)  # the Hub processor is saved too
        np.testing.assert_array_equal(m2.preprocess(img), m.preprocess(img))
        np.testing.assert_array_equal(m2.forward_features(x), m.forward_features(x))
        m = self.hub("deit_rt", hf_ref.vit_config("deit", "DeiTForImageClassificationWithTeacher"))
        m.reset_head(3, seed=1)
        self.assertEqual(self.round_trip(m, x, "hf_deit").config["num_prefix_tokens"], 2)
        m = self.hub("dino_rt", hf_ref.dinov2_config(registers=2))
        path = os.path.join(self.tmp, "dino.safetensors")
        m.save(path)
        m2 = vitc.load_model(path)
        self.assertEqual(m2.config["family"], "hf-dinov2")
        np.testing.assert_array_equal(m2.embed(self.xd), m.embed(self.xd))
        m.reset_head(4, seed=1)
        self.round_trip(m, self.xd, "hf_dino")
        for name, cfg, make in (("clip", hf_ref.clip_config("clip"), hf_ref.clip_random_state),
                                ("siglip", hf_ref.siglip_config("siglip"),
                                 hf_ref.siglip_random_state)):
            sd, ints = make(cfg, 0)
            d = os.path.join(self.tmp, name + "_rt")
            hf_ref.save_clip(d, sd, ints, cfg)
            m = vitc.load_model(d)
            path = os.path.join(self.tmp, name + ".safetensors")
            m.save(path)
            m2 = vitc.load_model(path)
            self.assertEqual(m2.config["family"], m.config["family"])
            np.testing.assert_array_equal(m2.embed(x), m.embed(x))
            np.testing.assert_array_equal(m2.forward_features(x), m.forward_features(x))

    def test_hf_deit_with_teacher_both_heads(self):
        m = self.hub("deit", hf_ref.vit_config("deit", "DeiTForImageClassificationWithTeacher"))
        old = m.state_dict()
        m.reset_head(3, seed=9)
        sd = m.state_dict()
        for k in ("heads.head.weight", "heads.head_dist.weight"):
            self.assertEqual(sd[k].shape, (3, 48))
            self.assertFalse(np.array_equal(sd[k][:, :3], old[k][:3, :3]), k)
        self.assertFalse(np.array_equal(sd["heads.head.weight"], sd["heads.head_dist.weight"]))
        h = m.forward_features(self.x)  # every token after the final LayerNorm
        want = (f64(h[:, 0]) @ f64(sd["heads.head.weight"]).T +
                f64(h[:, 1]) @ f64(sd["heads.head_dist.weight"]).T) / 2
        close(self, m(self.x), want, "DeiT with teacher logits")

    def test_dinov2_classifier_layout(self):
        m = self.hub("dino", hf_ref.dinov2_config())
        h = m.forward_features(self.xd)
        m.reset_head(4, seed=1)
        sd = m.state_dict()
        w, b = sd["heads.head.weight"], sd["heads.head.bias"]
        self.assertEqual(w.shape, (4, 96))  # [CLS, mean of the patch tokens]
        feat = np.concatenate([f64(h[:, 0]), f64(h[:, 1:]).mean(1)], axis=1)
        close(self, m(self.xd), feat @ f64(w).T + b, "Dinov2ForImageClassification logits")

    def test_clip_siglip_linear_classifier_rows(self):
        cfg = hf_ref.clip_config("clip")
        sd, ints = hf_ref.clip_random_state(cfg, 0)
        d = os.path.join(self.tmp, "clip")
        hf_ref.save_clip(d, sd, ints, cfg)
        m = vitc.load_model(d)
        proj = m.state_dict()["heads.head.weight"]  # visual_projection [E, C]
        E = proj.shape[0]
        emb = m.embed(self.x)  # image_embeds
        m.reset_head(5, labels=list("vwxyz"), seed=0)
        st = m.state_dict()
        self.assertTrue(m.config["has_head"])
        self.assertEqual(m.config["num_classes"], 5)
        self.assertEqual(m.labels, list("vwxyz"))
        np.testing.assert_array_equal(st["heads.head.weight"], proj)  # the embedding head kept
        self.assertEqual(st["classifier.weight"].shape, (5, E))
        self.assertEqual(st["classifier.bias"].shape, (5,))
        close(self, m(self.x), f64(emb) @ f64(st["classifier.weight"]).T + st["classifier.bias"],
              "CLIP classifier logits over image_embeds")
        cfg = hf_ref.siglip_config("siglip")
        sd, ints = hf_ref.siglip_random_state(cfg, 3)
        d = os.path.join(self.tmp, "siglip")
        hf_ref.save_clip(d, sd, ints, cfg)
        m = vitc.load_model(d)
        probe = m.state_dict()["attn_pool.latent"]
        pooled = m.embed(self.x)  # the MAP head's output, what the classifier reads
        m.reset_head(2, seed=0)
        st = m.state_dict()
        np.testing.assert_array_equal(st["attn_pool.latent"], probe)
        self.assertEqual(st["classifier.weight"].shape, (2, 48))  # over the MAP head's output
        np.testing.assert_array_equal(m.embed(self.x), pooled)  # the embedding unchanged
        close(self, m(self.x), f64(pooled) @ f64(st["classifier.weight"]).T +
              st["classifier.bias"], "SigLIP classifier logits")
        path = os.path.join(self.tmp, "siglip_clf.safetensors")
        m.save(path)
        np.testing.assert_array_equal(vitc.load_model(path)(self.x), m(self.x))

    def test_t2t_head_trunc_normal(self):
        cfg = t2t_ref.t2t_config("performer", img_size=64, embed_dim=48, depth=1, num_heads=3,
                                 mlp_ratio=2.0, token_dim=16, num_classes=0)
        sd = t2t_ref.random_state(cfg, seed=1)
        path = os.path.join(self.tmp, "t2t.safetensors")
        st_write.write(path, sd, t2t_ref.metadata(cfg))
        m = vitc.load_model(path)
        self.assertFalse(m.config["has_head"])
        x = random_images(torch.Generator().manual_seed(2), [(64, 64)])[(64, 64)].numpy()
        cls = m.embed(x)
        m.reset_head(8, seed=5)
        st = m.state_dict()
        w, b = st["head.weight"], st["head.bias"]
        self.assertEqual(w.shape, (8, 48))
        # T2T_ViT._init_weights: trunc_normal_(std=.02), bias zeros
        self.assertFalse(b.any())
        self.assertLess(abs(float(w.std()) - 0.02), 0.006)
        close(self, m(x), f64(cls) @ f64(w).T + b, "T2T-ViT logits")
        np.testing.assert_array_equal(m.embed(x), cls)  # the token module and encoder kept

    def test_bad_arguments(self):
        m = vitc.VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=3,
                                   hidden_dim=48, mlp_dim=96, num_classes=10, seed=1)
        with self.assertRaises(ValueError):
            m.reset_head(0)
        with self.assertRaises(ValueError):
            m.reset_head(3, labels=["a"])
        self.assertEqual(m.config["num_classes"], 10)


if __name__ == "__main__":
    unittest.main()
