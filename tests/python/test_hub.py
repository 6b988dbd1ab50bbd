"""Hugging Face Hub model directories (issue 10): HF ViT and DeiT through
vitc.load_model and `vitc embed` / `vitc classify` / `vitc inspect`,
against the torch reference forwards of tests/reference/hf_ref.py (which
this file first checks against torchvision's VisionTransformer at the same
weights). Small random configs with non-trivial weights, saved in the Hub's
exact layout: backbone prefix or none, F32/F16/BF16, sharded index, int64
position_ids and pooler tensors that the forward must skip. Malformed
directories must fail with an error naming what is wrong.

Needs torch and torchvision (the .venv that scripts/install-deps.sh makes); skipped without.
"""
import json
import os
import shutil
import unittest

import numpy as np

import vitc

try:
    from .util import (DATA, PHOTO, VITC, TmpDirCase, assert_close as close, random_images,
                       reference_modules, run_vitc as run, torch, write_json)
except ImportError:  # run as a script
    from util import (DATA, PHOTO, VITC, TmpDirCase, assert_close as close, random_images,
                      reference_modules, run_vitc as run, torch, write_json)
try:
    from torchvision.models.vision_transformer import VisionTransformer as TVViT
except ImportError:  # pragma: no cover
    torch = None
hf_ref, = reference_modules("hf_ref")


@unittest.skipIf(torch is None, "needs torch and torchvision")
class TestReferenceVsTorchvision(unittest.TestCase):
    def test_hf_vit_reference_matches_torchvision(self):
        """The HF ViT reference (eps 1e-6 here, torchvision's) equals
        torchvision's VisionTransformer with the documented renames."""
        cfg = hf_ref.vit_config(eps=1e-6)
        sd = hf_ref.random_state(cfg, seed=3)
        D, L = cfg["hidden_size"], cfg["num_hidden_layers"]
        tv = TVViT(image_size=32, patch_size=8, num_layers=L, num_heads=3, hidden_dim=D,
                   mlp_dim=96, num_classes=7).eval()
        t = {"class_token": sd["embeddings.cls_token"],
             "conv_proj.weight": sd["embeddings.patch_embeddings.projection.weight"],
             "conv_proj.bias": sd["embeddings.patch_embeddings.projection.bias"],
             "encoder.pos_embedding": sd["embeddings.position_embeddings"],
             "encoder.ln.weight": sd["layernorm.weight"], "encoder.ln.bias": sd["layernorm.bias"],
             "heads.head.weight": sd["classifier.weight"], "heads.head.bias": sd["classifier.bias"]}
        for i in range(L):
            h, o = "encoder.layer.%d." % i, "encoder.layers.encoder_layer_%d." % i
            a = h + "attention.attention."
            t[o + "self_attention.in_proj_weight"] = torch.cat(
                [sd[a + n + ".weight"] for n in ("query", "key", "value")])
            t[o + "self_attention.in_proj_bias"] = torch.cat(
                [sd[a + n + ".bias"] for n in ("query", "key", "value")])
            for src, dst in [("layernorm_before", "ln_1"), ("layernorm_after", "ln_2"),
                             ("attention.output.dense", "self_attention.out_proj"),
                             ("intermediate.dense", "mlp.0"), ("output.dense", "mlp.3")]:
                t[o + dst + ".weight"] = sd[h + src + ".weight"]
                t[o + dst + ".bias"] = sd[h + src + ".bias"]
        tv.load_state_dict(t)
        x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ref = tv(x)
        logits, _ = hf_ref.forward(sd, cfg, x)
        self.assertLess((logits - ref).abs().max().item(), 1e-5)


@unittest.skipIf(torch is None, "needs torch and torchvision")
class TestHubModels(TmpDirCase):
    TMP_PREFIX = "vitc_hub_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        gen = torch.Generator().manual_seed(1)
        cls.x = random_images(gen, [(32, 32), (40, 24)])
        # DINOv2 (patch 6, a 7x7 Hub grid): native, shrunk, non-square, grown.
        cls.xd = random_images(gen, [(42, 42), (24, 24), (30, 18), (60, 48)])

    def make(self, name, model_type, arch, seed=0, **kw):
        if model_type.startswith("dinov2"):
            cfg = hf_ref.dinov2_config(kw.pop("registers", None), swiglu=kw.pop("swiglu", False),
                                       classes=kw.pop("classes", 0))
        else:
            cfg = hf_ref.vit_config(model_type, arch, **{k: kw.pop(k) for k in list(kw)
                                                         if k in ("qkv_bias", "eps")})
        sd = hf_ref.random_state(cfg, seed, pooler=kw.pop("pooler", False))
        sd = hf_ref.round_as(sd, kw.get("dtype", "F32"))
        d = os.path.join(self.tmp, name)
        hf_ref.save_hub(d, sd, cfg, **kw)
        return d, sd, cfg

    def check(self, d, sd, cfg, path=None):
        m = vitc.load_model(path or d)
        for (H, W), x in (self.xd if hf_ref.is_dino(cfg) else self.x).items():
            logits, hidden = hf_ref.forward(sd, cfg, x)
            what = "%s %dx%d" % (os.path.basename(d), H, W)
            close(self, m.forward_features(x.numpy()), hidden, what + " last_hidden_state")
            close(self, m.embed(x.numpy()), hidden[:, 0], what + " embed")
            close(self, m.embed(x.numpy(), pool="mean"),
                  hidden[:, m.config["num_prefix_tokens"]:].mean(1), what + " mean")
            close(self, m.embed(x.numpy(), pool="tokens"),
                  hidden[:, m.config["num_prefix_tokens"]:], what + " tokens")
            e = m.embed(x.numpy(), normalize=True)
            close(self, e, torch.nn.functional.normalize(hidden[:, 0], dim=-1), what + " normalized")
            if logits is not None:
                close(self, m(x.numpy()), logits, what + " logits")
            else:
                close(self, m(x.numpy()), hidden[:, 0], what + " __call__ (embedding)")
        return m

    def test_vit_classifier_prefixed(self):
        d, sd, cfg = self.make("vit_cls", "vit", "ViTForImageClassification")
        m = self.check(d, sd, cfg)
        self.assertEqual(m.config["family"], "hf-vit")
        self.assertAlmostEqual(m.config["norm_eps"], 1e-12, delta=1e-15)
        self.assertEqual(m.labels[3], "class_3")
        self.assertEqual(m.config["mean"], [0.5, 0.5, 0.5])

    def test_vit_backbone_unprefixed_with_pooler(self):
        d, sd, cfg = self.make("vit_model", "vit", "ViTModel", pooler=True, prefix=False)
        m = self.check(d, sd, cfg)
        self.assertFalse(m.config["has_head"])
        self.assertEqual(sorted(m.config["ignored"]), ["pooler.dense.bias", "pooler.dense.weight"])

    def test_vit_classifier_unprefixed_no_qkv_bias(self):
        d, sd, cfg = self.make("vit_nobias", "vit", "ViTForImageClassification", prefix=False,
                               qkv_bias=False)
        self.check(d, sd, cfg)

    def test_deit_with_teacher_sharded_bf16_position_ids(self):
        ids = np.arange(18, dtype=np.int64)[None]
        d, sd, cfg = self.make("deit_teacher", "deit", "DeiTForImageClassificationWithTeacher",
                               dtype="BF16", shards=3,
                               extra={"deit.embeddings.position_ids": ids})
        m = self.check(d, sd, cfg)
        self.assertEqual(m.config["num_prefix_tokens"], 2)
        self.assertEqual(m.config["ignored"], ["deit.embeddings.position_ids"])
        # The index file itself is a way in too.
        self.check(d, sd, cfg, os.path.join(d, "model.safetensors.index.json"))

    def test_deit_single_head_f16(self):
        d, sd, cfg = self.make("deit_cls", "deit", "DeiTForImageClassification", dtype="F16")
        self.check(d, sd, cfg)

    def test_dinov2(self):
        d, sd, cfg = self.make("dinov2", "dinov2", "Dinov2Model", prefix=False)
        m = self.check(d, sd, cfg)
        self.assertEqual(m.config["family"], "hf-dinov2")
        self.assertEqual(m.config["ignored"], ["embeddings.mask_token"])
        self.assertAlmostEqual(m.config["norm_eps"], 1e-6, delta=1e-12)
        # BiT's default mean/std (OpenAI CLIP's) without preprocessor_config.json.
        self.assertAlmostEqual(m.config["mean"][0], 0.48145466, places=6)

    def test_dinov2_with_registers_antialiased_positions(self):
        d, sd, cfg = self.make("dinov2_reg", "dinov2_with_registers", "Dinov2WithRegistersModel",
                               registers=4, dtype="BF16", shards=2)
        m = self.check(d, sd, cfg)
        self.assertEqual(m.config["num_prefix_tokens"], 5)
        # The rule matters: without antialias the reference moves far off.
        x = self.xd[(24, 24)]
        plain = dict(cfg, model_type="dinov2")
        _, h_plain = hf_ref.forward(sd, plain, x)
        self.assertGreater(np.abs(m.embed(x.numpy()) - h_plain[:, 0].numpy()).max(), 1e-3)

    def test_dinov2_parameters_moved(self):
        """The resampled position embedding (cached per image size) and the
        layer scale folded into the packed weights follow new parameters."""
        d, sd, cfg = self.make("dinov2_moved", "dinov2", "Dinov2Model", prefix=False)
        m = vitc.load_model(d)
        x = self.xd[(24, 24)]
        _, h = hf_ref.forward(sd, cfg, x)
        close(self, m.embed(x.numpy()), h[:, 0], "before")
        # vitc's (torchvision) name of each HF tensor moved
        moved = {"embeddings.position_embeddings": "encoder.pos_embedding"}
        for i in range(cfg["num_hidden_layers"]):
            for j in (1, 2):
                moved["encoder.layer.%d.layer_scale%d.lambda1" % (i, j)] = \
                    "encoder.layers.encoder_layer_%d.ls%d.gamma" % (i, j)
        g = torch.Generator().manual_seed(7)
        sd2, st = dict(sd), m.state_dict()
        for k, n in moved.items():
            sd2[k] = sd[k] + torch.randn(sd[k].shape, generator=g) * 0.5
            st[n] = sd2[k].numpy()
        m.load_state_dict(st)
        _, h2 = hf_ref.forward(sd2, cfg, x)
        self.assertGreater((h2[:, 0] - h[:, 0]).abs().max().item(), 1e-2)
        close(self, m.embed(x.numpy()), h2[:, 0], "after load_state_dict")

    def test_dinov2_swiglu(self):
        """The giant's SwiGLU MLP (hidden (int(h * 2/3) + 7) // 8 * 8)."""
        d, sd, cfg = self.make("dinov2_swiglu", "dinov2", "Dinov2Model", swiglu=True)
        self.check(d, sd, cfg)

    def test_dinov2_classifiers(self):
        """Dinov2[WithRegisters]ForImageClassification: the head on [CLS, mean
        of the patch tokens] (registers excluded), prefixed backbone."""
        for reg in (None, 2):
            kind = "dinov2" if reg is None else "dinov2_with_registers"
            d, sd, cfg = self.make("dino_cls_%s" % reg, kind, "", registers=reg, classes=5)
            m = self.check(d, sd, cfg)
            self.assertTrue(m.config["has_head"])
            self.assertEqual(m.config["num_classes"], 5)
        # Training mode with (practically never dropping) dropout takes the
        # regularised branch, which must keep the layer scale.
        x = self.xd[(24, 24)].numpy()
        want = m(x)
        m.set_dropout(dropout=1e-9)
        m.train()
        close(self, m(x), want, "train mode, dropout 1e-9")

    def test_dinov2_registers_zero_prefixed(self):
        d, sd, cfg = self.make("dinov2_reg0", "dinov2_with_registers", "Dinov2WithRegistersModel",
                               registers=0, dtype="F16")
        self.check(d, sd, cfg)

    # ---- CLIP -------------------------------------------------------------

    def check_clip(self, name, cfg, dtype="F32", prefix=True, seed=0):
        sd, ints = hf_ref.clip_random_state(cfg, seed)
        sd = hf_ref.round_as(sd, dtype)
        d = os.path.join(self.tmp, name)
        hf_ref.save_clip(d, sd, ints, cfg, dtype=dtype, prefix=prefix)
        m = vitc.load_model(d)
        for (H, W), x in self.x.items():
            h, pooled, emb = hf_ref.clip_forward(sd, cfg, x)
            what = "%s %dx%d" % (name, H, W)
            close(self, m.forward_features(x.numpy()), h, what + " last_hidden_state (un-normed)")
            close(self, m.embed(x.numpy(), pool="cls"), pooled, what + " pooler_output")
            close(self, m.embed(x.numpy(), pool="tokens"), h[:, 1:], what + " tokens")
            close(self, m.embed(x.numpy(), pool="mean"), h[:, 1:].mean(1), what + " mean")
            want = emb if emb is not None else pooled
            close(self, m.embed(x.numpy()), want, what + " default embedding")
            close(self, m(x.numpy()), want, what + " __call__")
        return m, d

    def test_clip_model_with_text_tower(self):
        m, _ = self.check_clip("clip", hf_ref.clip_config("clip"))
        self.assertEqual(m.config["family"], "hf-clip")
        self.assertFalse(m.config["has_head"])
        # the text tower is read (docs/text-towers.md), no longer ignored
        self.assertTrue(m.has_text)
        self.assertNotIn("logit_scale", m.config["ignored"])
        self.assertNotIn("text_projection.weight", m.config["ignored"])
        self.assertIn("vision_model.embeddings.position_ids", m.config["ignored"])
        self.assertAlmostEqual(m.config["norm_eps"], 1e-5, delta=1e-11)

    def test_clip_vision_with_projection_gelu_bf16(self):
        self.check_clip("clip_vp", hf_ref.clip_config("clip_vision_model", act="gelu"),
                        dtype="BF16")

    def test_clip_vision_no_projection_tanh_unprefixed(self):
        cfg = hf_ref.clip_config("clip_vision_model", act="gelu_pytorch_tanh", proj=0)
        cfg["architectures"] = ["CLIPVisionModel"]
        del cfg["projection_dim"]
        m, _ = self.check_clip("clip_v", cfg, prefix=False, dtype="F16")
        self.assertEqual(m.embed(self.x[(32, 32)].numpy()).shape, (2, 48))

    def test_clip_projection_dim_mismatch(self):
        cfg = hf_ref.clip_config("clip")
        sd, ints = hf_ref.clip_random_state(cfg, 0)
        d = os.path.join(self.tmp, "clip_bad")
        cfg["projection_dim"] = 17
        hf_ref.save_clip(d, sd, ints, cfg)
        self.bad(d, "projection_dim 17", "visual_projection.weight has 16 rows")

    # ---- SigLIP -----------------------------------------------------------

    def check_siglip(self, name, cfg, dtype="F32"):
        sd, ints = hf_ref.siglip_random_state(cfg, 3)
        sd = hf_ref.round_as(sd, dtype)
        d = os.path.join(self.tmp, name)
        hf_ref.save_clip(d, sd, ints, cfg, dtype=dtype)
        m = vitc.load_model(d)
        xs = dict(self.x)
        xs[(24, 24)] = self.xd[(24, 24)]
        for (H, W), x in xs.items():
            h, pooled = hf_ref.siglip_forward(sd, cfg, x)
            what = "%s %dx%d" % (name, H, W)
            close(self, m.forward_features(x.numpy()), h, what + " last_hidden_state")
            close(self, m.embed(x.numpy(), pool="tokens"), h, what + " tokens")
            close(self, m.embed(x.numpy(), pool="mean"), h.mean(1), what + " mean")
            want = pooled if pooled is not None else h.mean(1)
            close(self, m.embed(x.numpy()), want, what + " default (pooler_output)")
            close(self, m(x.numpy()), want, what + " __call__")
        with self.assertRaises(vitc.VitcError) as cm:
            m.embed(self.x[(32, 32)].numpy(), pool="cls")
        self.assertIn("no class token", str(cm.exception))
        return m, sd

    def test_siglip_model_with_text_tower(self):
        cfg = hf_ref.siglip_config("siglip")
        m, sd = self.check_siglip("siglip", cfg)
        self.assertEqual(m.config["family"], "hf-siglip")
        self.assertEqual(m.config["num_prefix_tokens"], 0)
        self.assertTrue(m.has_text)
        self.assertNotIn("logit_bias", m.config["ignored"])
        # The resampling rule matters at 24x24 (a 4x4 grid to 3x3): 4.x's +0.1 differs.
        x = self.xd[(24, 24)]
        _, pooled = hf_ref.siglip_forward(sd, cfg, x)
        save = hf_ref.interpolate_pos_siglip
        try:
            hf_ref.interpolate_pos_siglip = hf_ref.interpolate_pos_legacy
            _, other = hf_ref.siglip_forward(sd, cfg, x)
        finally:
            hf_ref.interpolate_pos_siglip = save
        self.assertGreater((other - pooled).abs().max().item(), 1e-3)

    def test_siglip_vision_bf16_and_headless(self):
        self.check_siglip("siglip_v", hf_ref.siglip_config("siglip_vision_model"), dtype="BF16")
        self.check_siglip("siglip_nohead",
                          hf_ref.siglip_config("siglip_vision_model", use_head=False))

    def test_lone_safetensors_with_config_beside(self):
        d, sd, cfg = self.make("lone", "vit", "ViTForImageClassification", seed=5)
        self.check(d, sd, cfg, os.path.join(d, "model.safetensors"))

    def test_preprocessor_mean_std(self):
        pp = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
              "do_resize": True, "size": {"height": 32, "width": 32}}
        d, _, _ = self.make("pp", "deit", "DeiTForImageClassification", preprocessor=pp)
        m = vitc.load_model(d)
        np.testing.assert_allclose(m.config["mean"], pp["image_mean"], rtol=1e-6)
        np.testing.assert_allclose(m.config["std"], pp["image_std"], rtol=1e-6)

    # ---- preprocessing ----------------------------------------------------

    def test_processors_match_pil_reference(self):
        """Each family's processor (defaults and preprocessor_config.json)
        against a PIL + numpy reference of its rules, on real photos of
        several sizes and modes (RGB, gray, palette; JPEG and PNG)."""
        data = DATA
        photos = [os.path.join(data, f) for f in ("photo.png", "photo.jpg", "gray.jpg",
                                                  "palette.png", "gray_alpha.png")]
        try:
            from skimage import data as skd  # python3-skimage's photos, when installed
            extra = [("astronaut", skd.astronaut()), ("coffee", skd.coffee())]
        except Exception:  # pragma: no cover
            extra = []
        dirs = {"vit": self.make("pp_vit", "vit", "ViTModel")[0],
                "deit": self.make("pp_deit", "deit", "DeiTModel")[0],
                "dinov2": self.make("pp_dino", "dinov2", "Dinov2Model", prefix=False)[0]}
        for fam, model_type in (("clip", "clip_vision_model"), ("siglip", "siglip_vision_model")):
            cfg = (hf_ref.clip_config if fam == "clip" else hf_ref.siglip_config)(model_type)
            sd, ints = (hf_ref.clip_random_state if fam == "clip" else hf_ref.siglip_random_state)(cfg)
            dirs[fam] = os.path.join(self.tmp, "pp_" + fam)
            hf_ref.save_clip(dirs[fam], sd, ints, cfg)
        configs = [None,  # the class defaults
                   {"size": 40, "crop_size": 32, "resample": 2},  # legacy ints
                   {"size": {"shortest_edge": 37}, "crop_size": {"height": 31, "width": 29},
                    "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
                   {"size": {"height": 300, "width": 250}, "do_center_crop": False,
                    "resample": 3},  # upscaling, no crop
                   {"do_resize": False, "do_center_crop": False, "do_normalize": False}]
        pp_path = lambda fam: os.path.join(dirs[fam], "preprocessor_config.json")
        for fam, d in dirs.items():
            for pp in configs:
                if pp is None:
                    if os.path.exists(pp_path(fam)):
                        os.remove(pp_path(fam))
                else:
                    write_json(pp_path(fam), pp)
                m = vitc.load_model(d)
                for name, rgb in [(p, vitc.load_image(p)) for p in photos] + extra:
                    want = hf_ref.process(rgb, fam, pp or {})
                    got = m.preprocess(rgb)
                    self.assertEqual(got.shape, want.shape, (fam, pp, name))
                    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6,
                                               err_msg="%s %s %s" % (fam, pp, name))
                if pp is None:
                    np.testing.assert_allclose(m.preprocess(photos[0]),
                                               hf_ref.process(vitc.load_image(photos[0]), fam, {}),
                                               atol=1e-6)

    # ---- CLI ---------------------------------------------------------------

    @unittest.skipIf(not os.path.exists(VITC), "needs build/vitc")
    def test_cli_embed_classify_inspect(self):
        d, sd, cfg = self.make("cli", "deit", "DeiTForImageClassificationWithTeacher", seed=7,
                               extra={"deit.embeddings.position_ids":
                                      np.arange(18, dtype=np.int64)[None]})
        # A Hub model's own processor (here its file: 40x40 square, crop 32),
        # checked against the PIL reference, feeds the reference forward.
        pp = {"size": 40, "crop_size": 32, "resample": 3, "image_mean": [0.5, 0.4, 0.3],
              "image_std": [0.2, 0.3, 0.25]}
        write_json(os.path.join(d, "preprocessor_config.json"), pp)
        img = hf_ref.process(vitc.load_image(PHOTO), "deit", pp)
        np.testing.assert_allclose(vitc.load_model(d).preprocess(PHOTO), img, atol=1e-6)
        x = torch.from_numpy(np.ascontiguousarray(img))[None]
        logits, hidden = hf_ref.forward(sd, cfg, x)
        # --crop: torchvision's transform instead, as for any checkpoint.
        tv = vitc.preprocess_image(vitc.load_image(PHOTO), resize=36, crop=32, mean=pp["image_mean"],
                                   std=pp["image_std"])
        _, tv_hidden = hf_ref.forward(sd, cfg, torch.from_numpy(np.ascontiguousarray(tv))[None])
        rc, out, err = run("embed", "--model", d, "--crop", "32", "--json", PHOTO)
        self.assertEqual(rc, 0, err)
        close(self, json.loads(out)["embedding"], tv_hidden[0, 0], "vitc embed --crop")
        rc, out, err = run("embed", "--model", d, "--json", PHOTO, PHOTO)
        self.assertEqual(rc, 0, err)
        lines = [json.loads(s) for s in out.splitlines()]
        self.assertEqual(len(lines), 2)
        self.assertEqual(lines[0]["image"], PHOTO)
        close(self, lines[1]["embedding"], hidden[0, 0], "vitc embed --json")
        npy = os.path.join(self.tmp, "e.npy")
        rc, out, err = run("embed", "--model", d, "--normalize", "--out", npy, PHOTO)
        self.assertEqual(rc, 0, err)
        close(self, np.load(npy), torch.nn.functional.normalize(hidden[:, 0], dim=-1),
              "vitc embed --normalize --out")
        rc, out, err = run("embed", "--model", d, "--pool", "tokens", "--out", npy, PHOTO)
        self.assertEqual(rc, 0, err)
        close(self, np.load(npy), hidden[:, 2:], "vitc embed --pool tokens")
        rc, out, err = run("classify", "--model", d, "--json", "--topk", "3", PHOTO)
        self.assertEqual(rc, 0, err)
        top = json.loads(out)["topk"]
        ref = logits[0].numpy()
        self.assertEqual([t["index"] for t in top], list(np.argsort(-ref)[:3]))
        self.assertEqual(top[0]["label"], "class_%d" % top[0]["index"])
        close(self, [t["logit"] for t in top], np.sort(ref)[::-1][:3], "vitc classify logits")
        rc, out, err = run("inspect", d)
        self.assertEqual(rc, 0, err)
        self.assertIn("hf-deit", out)
        self.assertIn("deit.embeddings.position_ids", out)
        rc, out, err = run("inspect", "--json", os.path.join(d, "model.safetensors"))
        self.assertEqual(rc, 0, err)
        j = json.loads(out)
        self.assertEqual(j["ignored"], ["deit.embeddings.position_ids"])
        self.assertEqual(j["prefix_tokens"], 2)
        rc, out, err = run("embed", "--model", d, "--pool", "max", PHOTO)
        self.assertEqual(rc, 2)
        # attention-map: the class token's row, past the distillation token.
        png = os.path.join(self.tmp, "am.png")
        for method in ("cls", "rollout"):
            rc, out, err = run("attention-map", "--model", d, "--method", method, "--out", png, PHOTO)
            self.assertEqual(rc, 0, err)
        m = vitc.load_model(d)
        attn, roll = m.attention_maps(x.numpy())
        self.assertEqual(attn.shape, (2, 1, 3, 18, 18))
        np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)

    @unittest.skipIf(not os.path.exists(VITC), "needs build/vitc")
    def test_cli_similar(self):
        cfg = hf_ref.clip_config("clip")
        sd, ints = hf_ref.clip_random_state(cfg, 4)
        d = os.path.join(self.tmp, "sim_model")
        hf_ref.save_clip(d, sd, ints, cfg)
        idx = os.path.join(self.tmp, "sim_index")
        os.makedirs(idx)
        data = DATA
        for f in ("photo.png", "photo.jpg", "gray.jpg", "palette.png"):
            shutil.copy(os.path.join(data, f), idx)
        cdir = os.path.join(self.tmp, "sim_cache")
        rc, out, err = run("similar", "--model", d, "--index", idx, "--json", "--topk", "3",
                           "--cache", cdir, os.path.join(data, "gray.jpg"))
        self.assertEqual(rc, 0, err)
        res = [json.loads(s) for s in out.splitlines()]
        self.assertEqual(len(res), 3)
        m = vitc.load_model(d)
        q = m.embed(m.preprocess(os.path.join(data, "gray.jpg"))[None], normalize=True)[0]
        scores = {f: float(q @ m.embed(m.preprocess(os.path.join(idx, f))[None], normalize=True)[0])
                  for f in os.listdir(idx) if not f.startswith(".")}
        want = sorted(scores.items(), key=lambda kv: -kv[1])[:3]
        self.assertEqual([os.path.basename(r["image"]) for r in res], [k for k, _ in want])
        for r, (_, sc) in zip(res, want):
            self.assertAlmostEqual(r["score"], sc, places=4)
        self.assertFalse(os.path.exists(os.path.join(idx, ".vitc-similar.safetensors")))
        (cache,) = [os.path.join(cdir, f) for f in os.listdir(cdir)]
        t0 = os.stat(cache).st_mtime_ns
        self.assertEqual(run("similar", "--model", d, "--index", idx, "--cache", cdir, PHOTO)[0], 0)
        self.assertEqual(os.stat(cache).st_mtime_ns, t0)  # reused
        shutil.copy(PHOTO, os.path.join(idx, "new.png"))
        rc, out, err = run("similar", "--model", d, "--index", idx, "--cache", cdir, "--topk", "1",
                           PHOTO)
        self.assertEqual(rc, 0, err)
        self.assertNotEqual(os.stat(cache).st_mtime_ns, t0)  # rebuilt
        self.assertTrue(out.startswith("1.000000"))

    # ---- malformed directories --------------------------------------------

    def bad(self, path, *needles):
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.load_model(path)
        for n in needles:
            self.assertIn(n, str(cm.exception))
        if os.path.exists(VITC):
            rc, _, err = run("embed", "--model", path, PHOTO)
            self.assertEqual(rc, 1)
            for n in needles:
                self.assertIn(n, err)

    def test_malformed(self):
        d, sd, cfg = self.make("bad_base", "vit", "ViTForImageClassification", seed=2)

        def variant(name, edit_cfg=None, drop=None):
            v = os.path.join(self.tmp, name)
            shutil.copytree(d, v)
            if edit_cfg is not None:
                c = dict(cfg)
                edit_cfg(c)
                write_json(os.path.join(v, "config.json"), c)
            if drop:
                os.remove(os.path.join(v, drop))
            return v

        self.bad(variant("no_config", drop="config.json"), "no config.json")
        self.bad(variant("no_weights", drop="model.safetensors"), "no model.safetensors")
        self.bad(variant("unknown_type", lambda c: c.update(model_type="swin")),
                 "unknown model_type \"swin\"")
        self.bad(variant("later_type", lambda c: c.update(model_type="siglip2")),
                 "\"siglip2\" is not supported")
        self.bad(variant("mismatch", lambda c: c.update(hidden_size=96, num_attention_heads=3)),
                 "vit.embeddings.cls_token", "[1, 1, 96]", "[1, 1, 48]")
        self.bad(variant("deeper", lambda c: c.update(num_hidden_layers=3)),
                 "missing tensor vit.encoder.layer.2.layernorm_before.weight")
        self.bad(variant("act", lambda c: c.update(hidden_act="relu")), "hidden_act relu")
        with open(os.path.join(variant("badjson"), "config.json"), "w") as f:
            f.write("{not json")
        self.bad(os.path.join(self.tmp, "badjson"), "config.json is not JSON")
        # A shard the index names is missing.
        s, _, _ = self.make("sharded", "vit", "ViTModel", shards=2)
        os.remove(os.path.join(s, "model-00002-of-00002.safetensors"))
        self.bad(s, "model-00002-of-00002.safetensors", "missing")
        # An unexpected tensor is named.
        u, sd2, cfg2 = self.make("extra", "vit", "ViTModel", extra={"text_model.x": np.zeros(2, np.float32)})
        self.bad(u, "unexpected tensor text_model.x")
        # A backbone has no logits: an error naming why, not garbage.
        b, _, _ = self.make("backbone", "vit", "ViTModel")
        m = vitc.load_model(b)
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.VisionTransformer.__call__(m, self.x[(32, 32)].numpy())
        self.assertIn("no classification head", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
