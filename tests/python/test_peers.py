"""Parity with the real implementations (issue 19): models built from
configs with random weights by transformers, timm and open_clip (nothing is
downloaded), written to disk the way their users have them, loaded by
vitc.load_model and compared with the library's own forward in fp32:
max|vitc - ref| / max|ref| <= 1e-5 for each output, at the config's size
and at a non-square one. test_hub.py and test_clip_names.py check the same
families against hand-written forwards; this file checks that those
forwards are still what the libraries pinned in requirements-dev.txt do
(renamed weights, new config defaults, changed position resampling).

Needs torch, transformers, timm and open_clip; each class is skipped
without its library.
"""
import json
import os
import unittest
from pathlib import Path

import numpy as np

import vitc

try:
    from .util import TmpDirCase, torch
except ImportError:  # run as a script
    from util import TmpDirCase, torch

try:
    import transformers
except ImportError:  # pragma: no cover
    transformers = None
try:
    import timm
    from timm.models import save_for_hf as timm_save_for_hf
except ImportError:  # pragma: no cover
    timm = None
try:
    import open_clip
    import safetensors.torch
    from open_clip.push_to_hf_hub import save_config_for_hf
except ImportError:  # pragma: no cover
    open_clip = None

TOL = 1e-5


def rel_err(got, ref):
    """max|got - ref| / max|ref| over the whole output."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def perturb(model, seed, prefix=""):
    """Every floating parameter (whose name starts with prefix) moved by
    seeded noise, so that no tensor is left at an initialiser's zero or one
    (biases, heads, class and register tokens, layer scale) and a wrongly
    mapped one shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if not p.dtype.is_floating_point or not name.startswith(prefix):
                continue
            if p.dim() >= 2:
                fan_in = max(1, p[0].numel())
                p.add_(torch.randn(p.shape, generator=g) * (0.5 / fan_in ** 0.5))
            else:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


class PeerCase(TmpDirCase):
    """Comparisons with a message naming the family, the output, the input
    size and the error."""
    errors = {}  # (family, output, size) -> relative error, for the report

    def setUp(self):
        torch.manual_seed(0)  # the libraries' own initialisation, before perturb()

    def check(self, family, output, size, got, ref):
        ref = ref.detach().numpy() if hasattr(ref, "detach") else np.asarray(ref)
        got = np.asarray(got)
        self.assertEqual(got.shape, ref.shape, "%s %s at %s: shape" % (family, output, size))
        err = rel_err(got, ref)
        PeerCase.errors[(family, output, "%dx%d" % size)] = err
        self.assertLessEqual(err, TOL, "%s %s at %dx%d: max|vitc - ref| / max|ref| = %.3g "
                             "(tolerance %g)" % ((family, output) + tuple(size) + (err, TOL)))


# ---------------------------------------------------------------------------
# transformers
# ---------------------------------------------------------------------------

def _hf_images(sizes, seed, batch=2):
    g = torch.Generator().manual_seed(seed)
    return {s: torch.randn(batch, 3, s[0], s[1], generator=g) for s in sizes}


@unittest.skipIf(torch is None or transformers is None, "needs torch and transformers")
class TestTransformers(PeerCase):
    """Each family saved by save_pretrained (safetensors), once whole and
    once in shards, loaded by vitc and compared with the model's forward at
    the config's size and a non-square one."""
    TMP_PREFIX = "vitc_peers_hf_"

    def save_both(self, model, name):
        """(whole directory, sharded directory) written by save_pretrained."""
        whole, sharded = self.path(name), self.path(name + "_shards")
        # transformers 5 writes safetensors only (safe_serialization is gone).
        model.save_pretrained(whole)
        model.save_pretrained(sharded, max_shard_size="40KB")
        self.assertEqual(sorted(f for f in os.listdir(whole) if "safetensors" in f),
                         ["model.safetensors"], name)
        with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
            shards = set(json.load(f)["weight_map"].values())
        self.assertGreater(len(shards), 1, "%s: save_pretrained did not shard" % name)
        return whole, sharded

    def run_family(self, family, model, outputs, sizes, seed=0):
        """outputs: [(name, ref(model, x, interpolate) -> tensor, got(vitc model, x))]
        compared at every size for the whole and the sharded directory;
        interpolate (interpolate_pos_encoding) is true at every size but the
        first, the config's."""
        perturb(model, seed)
        whole, sharded = self.save_both(model, family)
        xs = _hf_images(sizes, seed + 100)
        refs = {}
        with torch.no_grad():
            for s, x in xs.items():
                for name, ref, _ in outputs:
                    refs[s, name] = ref(model, x, s != sizes[0])
        for d in (whole, sharded):
            m = vitc.load_model(d)
            where = family + (" (shards)" if d == sharded else "")
            for s, x in xs.items():
                for name, _, got in outputs:
                    self.check(where, name, s, got(m, x.numpy()), refs[s, name])
        return m

    @staticmethod
    def _kw(interp):
        return {"interpolate_pos_encoding": True} if interp else {}

    def vit_like(self, model_cls, config, family, logits=True):
        model = model_cls(config)
        outs = [("last_hidden_state vs forward_features",
                 lambda mm, x, i: mm.base_model(x, **self._kw(i)).last_hidden_state,
                 lambda m, x: m.forward_features(x)),
                ("layernormed class token vs embed(default)",
                 lambda mm, x, i: mm.base_model(x, **self._kw(i)).last_hidden_state[:, 0],
                 lambda m, x: m.embed(x))]
        if logits:
            outs.append(("logits vs m(x)", lambda mm, x, i: mm(x, **self._kw(i)).logits,
                         lambda m, x: m(x)))
        return self.run_family(family, model, outs, [(32, 32), (32, 48)])

    def test_vit_for_image_classification(self):
        cfg = transformers.ViTConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                     intermediate_size=96, image_size=32, patch_size=8,
                                     num_labels=7)
        m = self.vit_like(transformers.ViTForImageClassification, cfg, "hf-vit")
        self.assertEqual(m.config["family"], "hf-vit")

    def test_deit_with_teacher(self):
        cfg = transformers.DeiTConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                      intermediate_size=96, image_size=32, patch_size=8,
                                      num_labels=5)
        self.vit_like(transformers.DeiTForImageClassificationWithTeacher, cfg, "hf-deit")

    def _dinov2(self, model_cls, family, **kw):
        cfg = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, mlp_ratio=2,
                   image_size=32, patch_size=8)
        cfg.update(kw)
        config_cls = (transformers.Dinov2WithRegistersConfig
                      if model_cls is transformers.Dinov2WithRegistersModel
                      else transformers.Dinov2Config)
        model = model_cls(config_cls(**cfg))
        if model_cls is transformers.Dinov2ForImageClassification:
            # The classifier reads [class token, mean of the patch tokens].
            outs = [("logits vs m(x)", lambda mm, x, i: mm(x).logits, lambda m, x: m(x)),
                    ("last_hidden_state vs forward_features",
                     lambda mm, x, i: mm.dinov2(x).last_hidden_state,
                     lambda m, x: m.forward_features(x))]
            return self.run_family(family, model, outs, [(32, 32), (32, 48)])
        outs = [("last_hidden_state vs forward_features",
                 lambda mm, x, i: mm(x).last_hidden_state, lambda m, x: m.forward_features(x)),
                ("pooler_output vs embed(default)",
                 lambda mm, x, i: mm(x).pooler_output, lambda m, x: m.embed(x))]
        # DINOv2 resamples at every size, the config's included; 24x40 shrinks one
        # axis, where the registers model's antialiasing acts.
        return self.run_family(family, model, outs, [(32, 32), (32, 48), (24, 40)])

    def test_dinov2(self):
        self._dinov2(transformers.Dinov2Model, "hf-dinov2")

    def test_dinov2_for_image_classification(self):
        self._dinov2(transformers.Dinov2ForImageClassification, "hf-dinov2-classifier",
                     num_labels=6)

    def test_dinov2_swiglu(self):
        self._dinov2(transformers.Dinov2Model, "hf-dinov2-swiglu", use_swiglu_ffn=True)

    def test_dinov2_with_registers(self):
        self._dinov2(transformers.Dinov2WithRegistersModel, "hf-dinov2-registers",
                     num_register_tokens=3)

    def _clip_vision(self, act):
        return dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                    intermediate_size=96, image_size=32, patch_size=8, projection_dim=24,
                    hidden_act=act)

    def test_clip_vision_with_projection(self):
        for act in ("quick_gelu", "gelu"):
            with self.subTest(act=act):
                model = transformers.CLIPVisionModelWithProjection(
                    transformers.CLIPVisionConfig(**self._clip_vision(act)))
                outs = [("last_hidden_state vs forward_features",
                         lambda mm, x, i: mm(x, **self._kw(i)).last_hidden_state,
                         lambda m, x: m.forward_features(x)),
                        ("image_embeds vs embed(default)",
                         lambda mm, x, i: mm(x, **self._kw(i)).image_embeds,
                         lambda m, x: m.embed(x)),
                        ("image_embeds vs m(x)",
                         lambda mm, x, i: mm(x, **self._kw(i)).image_embeds, lambda m, x: m(x))]
                self.run_family("hf-clip-vision-proj-" + act, model, outs, [(32, 32), (32, 48)])

    # The text tower of CLIPModel / SiglipModel, which vitc skips: as small as it gets.
    _TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=64, vocab_size=99, max_position_embeddings=16)

    def _image_features(self, mm, x, i):
        out = mm.get_image_features(pixel_values=x, **self._kw(i))
        return getattr(out, "pooler_output", out)  # a tensor in 4.x, an output object in 5.x

    def test_clip_model(self):
        model = transformers.CLIPModel(transformers.CLIPConfig(
            text_config=dict(self._TEXT, projection_dim=24),
            vision_config=self._clip_vision("quick_gelu"), projection_dim=24))
        outs = [("get_image_features vs embed(default)", self._image_features, lambda m, x: m.embed(x)),
                ("vision_model.last_hidden_state vs forward_features",
                 lambda mm, x, i: mm.vision_model(x, **self._kw(i)).last_hidden_state,
                 lambda m, x: m.forward_features(x)),
                ("vision_model.pooler_output vs embed(cls)",
                 lambda mm, x, i: mm.vision_model(x, **self._kw(i)).pooler_output,
                 lambda m, x: m.embed(x, pool="cls"))]
        m = self.run_family("hf-clip-model", model, outs, [(32, 32), (32, 48)])
        self.assertTrue(m.has_text)  # the text tower is read, no longer ignored
        self.assertFalse(any(n.startswith("text_model.") for n in m.config["ignored"]))

    _SIGLIP = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                   intermediate_size=96, image_size=32, patch_size=8)
    # 24x24 shrinks the 4x4 grid to 3x3, where transformers 4.x's +0.1 rule differed most.
    _SIGLIP_SIZES = [(32, 32), (32, 48), (24, 24)]

    def test_siglip_vision(self):
        model = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**self._SIGLIP))
        outs = [("last_hidden_state vs forward_features",
                 lambda mm, x, i: mm(x, **self._kw(i)).last_hidden_state,
                 lambda m, x: m.forward_features(x)),
                ("pooler_output (MAP head) vs embed(default)",
                 lambda mm, x, i: mm(x, **self._kw(i)).pooler_output, lambda m, x: m.embed(x))]
        self.run_family("hf-siglip-vision", model, outs, self._SIGLIP_SIZES)

    def test_siglip_model(self):
        model = transformers.SiglipModel(transformers.SiglipConfig(
            text_config=self._TEXT, vision_config=self._SIGLIP))
        outs = [("get_image_features vs embed(default)", self._image_features, lambda m, x: m.embed(x)),
                ("vision_model.last_hidden_state vs forward_features",
                 lambda mm, x, i: mm.vision_model(x, **self._kw(i)).last_hidden_state,
                 lambda m, x: m.forward_features(x))]
        m = self.run_family("hf-siglip-model", model, outs, self._SIGLIP_SIZES)
        self.assertTrue(m.has_text)
        self.assertNotIn("logit_bias", m.config["ignored"])


# ---------------------------------------------------------------------------
# timm and open_clip: full-size models, one image at their own size
# ---------------------------------------------------------------------------

def _image(size, seed, batch=1):
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


@unittest.skipIf(torch is None or timm is None, "needs torch and timm")
class TestTimm(PeerCase):
    """timm.create_model(name, pretrained=False), perturbed, written as the
    Hub has timm's models (save_for_hf: config.json naming the
    architecture, model.safetensors with timm's names)."""
    TMP_PREFIX = "vitc_peers_timm_"

    def save(self, model, name):
        d = self.path(name)
        timm_save_for_hf(model, d, safe_serialization=True)
        with open(os.path.join(d, "config.json")) as f:
            self.assertEqual(json.load(f)["architecture"], name)
        return d

    def compare(self, name, seed, size=224, **kw):
        """logits (or the backbone's pooled output) and forward_features of
        the saved model against timm's; (vitc model, directory, image, refs)."""
        model = perturb(timm.create_model(name, pretrained=False, **kw), seed)
        d = self.save(model, name)
        x = _image(size, seed + 100)
        with torch.no_grad():
            feats = model.forward_features(x)
            out = model.forward_head(feats)
        m = vitc.load_model(d)
        self.assertEqual(m.config["arch"], name)
        self.assertEqual(m.config["mean"], [np.float32(v) for v in model.pretrained_cfg["mean"]])
        what = "logits vs m(x)" if model.num_classes else "pooled output vs m(x)"
        self.check("timm " + name, what, (size, size), m(x.numpy()), out)
        self.check("timm " + name, "forward_features", (size, size),
                   m.forward_features(x.numpy()), feats)
        return m, d, x, out

    def test_vit_base_patch16_224(self):
        m, _, _, _ = self.compare("vit_base_patch16_224", 1)
        self.assertEqual(m.config["num_classes"], 1000)

    def test_deit_tiny_distilled(self):
        """Class and distillation tokens; eval logits = (head + head_dist) / 2."""
        m, d, x, out = self.compare("deit_tiny_distilled_patch16_224", 2)
        self.assertEqual(m.config["num_prefix_tokens"], 2)
        # The lone file (names alone, no config.json beside it to read).
        lone = self.path("deit_lone.safetensors")
        os.rename(os.path.join(d, "model.safetensors"), lone)
        self.check("timm deit_tiny_distilled_patch16_224 (lone file)", "logits vs m(x)",
                   (224, 224), vitc.load_model(lone)(x.numpy()), out)

    def test_vit_small_patch14_dinov2(self):
        """Layer scale (ls1/ls2), no head (num_classes=0): m(x) is the class
        token after the final norm. At its own 518 px (37x37 grid)."""
        m, _, _, _ = self.compare("vit_small_patch14_dinov2", 3, size=518)
        self.assertFalse(m.config["has_head"])
        self.assertEqual(m.config["num_classes"], 0)

    def test_layer_scale_classifier_trains(self):
        """A classifier with layer scale runs forward, and trains: the layer
        scales' gradients are torch's (test_family_grads.py checks every
        tensor in float64)."""
        from timm.models.vision_transformer import VisionTransformer
        model = perturb(VisionTransformer(img_size=32, patch_size=8, embed_dim=128, depth=2,
                                          num_heads=2, init_values=1e-5, num_classes=5), 4)
        path = self.path("ls.safetensors")
        safetensors.torch.save_file(model.state_dict(), path)
        x = _image(32, 5, batch=2)
        m = vitc.load_model(path, arch=None)
        with torch.no_grad():
            self.check("timm VisionTransformer(init_values)", "logits vs m(x)", (32, 32),
                       m(x.numpy()), model(x))
        m.train()
        m(x.numpy())
        m.backward(np.ones((2, 5), np.float32))
        model.zero_grad()
        model(x).sum().backward()
        got, params = m.grads(), dict(model.named_parameters())
        for n in ("blocks.0.ls1.gamma", "blocks.1.ls2.gamma"):
            ref = params[n].grad.numpy()
            err = rel_err(got[n], ref)
            self.assertLessEqual(err, 1e-3, "timm VisionTransformer(init_values) %s gradient: "
                                 "max|vitc - torch| / max|torch| = %.3g" % (n, err))


    def test_small_variants_save_round_trip(self):
        """A distilled and a headless layer-scale model (timm's classes, small)
        as lone files against timm, then through vitc's own save and back:
        the options come from the names, num_classes 0 included."""
        from timm.models.deit import VisionTransformerDistilled
        from timm.models.vision_transformer import VisionTransformer
        small = dict(img_size=32, patch_size=8, embed_dim=128, depth=2, num_heads=2)
        cases = [("distilled", VisionTransformerDistilled(num_classes=5, **small), 2),
                 ("headless layer scale",
                  VisionTransformer(num_classes=0, init_values=1e-5, **small), 1)]
        x = _image(32, 8, batch=2)
        for i, (what, model, prefix) in enumerate(cases):
            perturb(model, 9 + i)
            path = self.path("small%d.safetensors" % i)
            safetensors.torch.save_file(model.state_dict(), path)
            with torch.no_grad():
                ref, feats = model(x), model.forward_features(x)
            m = vitc.load_model(path)
            self.assertEqual(m.config["num_prefix_tokens"], prefix, what)
            self.check("timm " + what, "m(x)", (32, 32), m(x.numpy()), ref)
            again = self.path("small%d_vitc.safetensors" % i)
            m.save(again)
            m2 = vitc.load_model(again)
            self.assertEqual(m2.config["num_classes"], m.config["num_classes"], what)
            self.check("timm " + what + " (vitc save)", "m(x)", (32, 32), m2(x.numpy()), ref)
            self.check("timm " + what + " (vitc save)", "forward_features", (32, 32),
                       m2.forward_features(x.numpy()), feats)


@unittest.skipIf(torch is None or open_clip is None, "needs torch and open_clip")
class TestOpenClip(PeerCase):
    """open_clip.create_model(name, pretrained=None), its image tower
    perturbed, written as open_clip's Hub directory (open_clip_config.json
    and open_clip_model.safetensors, as open_clip's save_for_hf writes
    them); vitc's default embedding against encode_image."""
    TMP_PREFIX = "vitc_peers_openclip_"

    def compare(self, name, seed):
        model = perturb(open_clip.create_model(name, pretrained=None), seed, prefix="visual.")
        d = self.path(name)
        os.makedirs(d)
        safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                    os.path.join(d, "open_clip_model.safetensors"))
        save_config_for_hf(model, Path(d) / "open_clip_config.json",
                           model_config=open_clip.get_model_config(name))
        x = _image(224, seed + 100)
        with torch.no_grad():
            ref = model.encode_image(x)
        m = vitc.load_model(d)
        self.assertEqual(m.config["family"], "open-clip")
        self.check("open_clip " + name, "encode_image vs embed(default)", (224, 224),
                   m.embed(x.numpy()), ref)
        self.check("open_clip " + name, "encode_image vs m(x)", (224, 224), m(x.numpy()), ref)
        return m

    def test_vit_b_32(self):
        self.compare("ViT-B-32", 6)

    def test_vit_b_16(self):
        self.compare("ViT-B-16", 7)


def tearDownModule():
    """VITC_PEERS_REPORT=1: each family's largest error, one line each."""
    if not os.environ.get("VITC_PEERS_REPORT"):
        return
    worst = {}
    for (family, output, size), err in PeerCase.errors.items():
        key = family.replace(" (shards)", "")
        if err >= worst.get(key, (-1.0,))[0]:
            worst[key] = (err, output, size)
    for family, (err, output, size) in sorted(worst.items()):
        print("%-45s %.2e  (%s at %s)" % (family, err, output, size))


if __name__ == "__main__":
    unittest.main()
