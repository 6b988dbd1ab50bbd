"""Gradients of every family against torch autograd on the real modules:
tiny random models built by transformers and timm (as test_peers.py builds
them), saved the way their users have them, loaded by vitc.load_model, run
in training mode for their primary output m(x) (logits, or the family's
embedding), back-propagated from a random dy, and compared with the same
module in float64: the output and every parameter's gradient, by the
checkpoint's own tensor name, at the config's size and at a non-square one
(where the position table is resampled, so its adjoint is checked too).

vitc runs fp32: max|g_vitc - g_ref| <= RTOL * max|g_ref| + ATOL per tensor.
"""
import json
import os
import unittest

import numpy as np

import vitc

try:
    from .util import TmpDirCase, torch
    from .test_peers import perturb
except ImportError:  # run as a script
    from util import TmpDirCase, torch
    from test_peers import perturb

try:
    import transformers
except ImportError:  # pragma: no cover
    transformers = None
try:
    import timm
except ImportError:  # pragma: no cover
    timm = None

RTOL, ATOL = 1e-4, 1e-6
SIZES = [(32, 32), (32, 48)]


class GradCase(TmpDirCase):
    """run(): the comparison for one saved model; ref(model, x, size) is the
    torch module's primary output for images x (float64)."""

    def setUp(self):
        torch.manual_seed(0)

    def run_family(self, family, model, ref, directory, sizes=SIZES, seed=0, skip=(), prep=None,
                   extra=None):
        """prep(m): called on the loaded model first; extra(): more reference
        gradients {name: array} (parameters outside model)."""
        model = model.double().eval()  # dropout rates are 0: eval and train agree
        m = vitc.load_model(directory)
        if prep:
            prep(m)
        m.train()
        rng = np.random.RandomState(seed)
        for size in sizes:
            where = "%s at %dx%d" % (family, size[0], size[1])
            x = rng.randn(2, 3, size[0], size[1]).astype(np.float32)
            m.zero_grad()
            y = m(x)
            model.zero_grad()
            out = ref(model, torch.from_numpy(x).double(), size)
            yr = out.detach().numpy()
            self.assertEqual(y.shape, yr.shape, "%s: output shape" % where)
            err = np.abs(y - yr).max()
            self.assertLessEqual(err, RTOL * np.abs(yr).max() + ATOL,
                                 "%s: output max|vitc - torch| = %.3g (max|torch| %.3g)"
                                 % (where, err, np.abs(yr).max()))
            dy = rng.randn(*y.shape).astype(np.float32)
            m.backward(dy)
            (out * torch.from_numpy(dy).double()).sum().backward()
            ref_grads = self.named_grads(model, where)
            if extra:
                ref_grads.update(extra())
            grads = m.grads()
            checked = 0
            for name, g in grads.items():
                if name in skip:
                    continue
                self.assertIn(name, ref_grads, "%s: vitc tensor %s is not a parameter of the "
                              "torch module" % (where, name))
                gr = ref_grads[name].reshape(g.shape)
                err = np.abs(g - gr).max()
                tol = RTOL * np.abs(gr).max() + ATOL
                self.assertLessEqual(err, tol, "%s: gradient of %s: max|vitc - torch| = %.3g, "
                                     "tolerance %.3g (max|torch| %.3g)"
                                     % (where, name, err, tol, np.abs(gr).max()))
                checked += 1
            self.assertGreater(checked, 10, where)
        return m


class HubGradCase(GradCase):
    def named_grads(self, model, where):
        """torch's gradients under the checkpoint's names: transformers 5
        renames modules on save, so the gradients go through save_pretrained
        in place of the weights."""
        import safetensors.numpy
        d = self.path("grads")
        with torch.no_grad():
            keep = {n: p.detach().clone() for n, p in model.named_parameters()}
            for _, p in model.named_parameters():
                p.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
            model.save_pretrained(d)
            for n, p in model.named_parameters():
                p.copy_(keep[n])
        return safetensors.numpy.load_file(os.path.join(d, "model.safetensors"))


def _kw(size):
    return {"interpolate_pos_encoding": True} if size != SIZES[0] else {}


@unittest.skipIf(torch is None or transformers is None, "needs torch and transformers")
class TestTransformersGrads(HubGradCase):
    TMP_PREFIX = "vitc_grads_hf_"

    def family(self, name, model, ref, sizes=SIZES):
        perturb(model, 1)
        d = self.path(name)
        model.save_pretrained(d)
        return self.run_family(name, model, ref, d, sizes)

    _VIT = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                intermediate_size=96, image_size=32, patch_size=8)

    def test_vit_for_image_classification(self):
        T = transformers
        self.family("hf-vit", T.ViTForImageClassification(T.ViTConfig(**self._VIT, num_labels=7)),
                    lambda mm, x, s: mm(x, **_kw(s)).logits)

    def test_vit_model(self):
        T = transformers
        self.family("hf-vit-model", T.ViTModel(T.ViTConfig(**self._VIT), add_pooling_layer=False),
                    lambda mm, x, s: mm(x, **_kw(s)).last_hidden_state[:, 0])

    def test_deit_with_teacher(self):
        T = transformers
        self.family("hf-deit", T.DeiTForImageClassificationWithTeacher(
            T.DeiTConfig(**self._VIT, num_labels=5)), lambda mm, x, s: mm(x, **_kw(s)).logits)

    def _dinov2(self, name, cls, **kw):
        T = transformers
        cfg = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, mlp_ratio=2,
                   image_size=32, patch_size=8)
        cfg.update(kw)
        config = (T.Dinov2WithRegistersConfig if cls is T.Dinov2WithRegistersModel
                  else T.Dinov2Config)(**cfg)
        ref = ((lambda mm, x, s: mm(x).logits) if cls is T.Dinov2ForImageClassification
               else (lambda mm, x, s: mm(x).pooler_output))
        # 24x40 shrinks one axis: the registers model's antialiased resampling acts
        return self.family(name, cls(config), ref, SIZES + [(24, 40)])

    def test_dinov2(self):
        self._dinov2("hf-dinov2", transformers.Dinov2Model)

    def test_dinov2_swiglu(self):
        self._dinov2("hf-dinov2-swiglu", transformers.Dinov2Model, use_swiglu_ffn=True)

    def test_dinov2_with_registers(self):
        self._dinov2("hf-dinov2-registers", transformers.Dinov2WithRegistersModel,
                     num_register_tokens=3)

    def test_dinov2_for_image_classification(self):
        self._dinov2("hf-dinov2-classifier", transformers.Dinov2ForImageClassification,
                     num_labels=6)

    def test_clip_vision_with_projection(self):
        T = transformers
        for act in ("quick_gelu", "gelu"):
            with self.subTest(act=act):
                self.family("hf-clip-" + act, T.CLIPVisionModelWithProjection(
                    T.CLIPVisionConfig(**self._VIT, projection_dim=24, hidden_act=act)),
                    lambda mm, x, s: mm(x, **_kw(s)).image_embeds)

    def test_reset_head_linear_over_embedding(self):
        """vitc_vit_reset_head on CLIP's and SigLIP's towers: a Linear over
        their embedding (image_embeds, pooler_output), trained end to end."""
        T = transformers
        for name, tower, emb in (
                ("hf-clip-reset", T.CLIPVisionModelWithProjection(
                    T.CLIPVisionConfig(**self._VIT, projection_dim=24)), lambda o: o.image_embeds),
                ("hf-siglip-reset", T.SiglipVisionModel(T.SiglipVisionConfig(**self._VIT)),
                 lambda o: o.pooler_output)):
            with self.subTest(family=name):
                perturb(tower, 1)
                d = self.path(name)
                tower.save_pretrained(d)
                held = {}

                def prep(m):
                    m.reset_head(5, seed=3)
                    sd = m.state_dict()
                    w = torch.from_numpy(sd["classifier.weight"]).double()
                    clf = torch.nn.Linear(w.shape[1], w.shape[0]).double()
                    with torch.no_grad():
                        clf.weight.copy_(w)
                        clf.bias.copy_(torch.from_numpy(sd["classifier.bias"]).double())
                    held["clf"] = clf

                def ref(mm, x, s):
                    held["clf"].zero_grad()
                    return held["clf"](emb(mm(x, **_kw(s))))

                def extra():
                    c = held["clf"]
                    return {"classifier.weight": c.weight.grad.numpy(),
                            "classifier.bias": c.bias.grad.numpy()}
                m = self.run_family(name, tower, ref, d, prep=prep, extra=extra)
                self.assertIn("classifier.weight", m.grads())

    def test_siglip_vision(self):
        T = transformers
        self.family("hf-siglip", T.SiglipVisionModel(T.SiglipVisionConfig(**self._VIT)),
                    lambda mm, x, s: mm(x, **_kw(s)).pooler_output, SIZES + [(24, 24)])

    def test_siglip_vision_without_head(self):
        """vision_use_head=False: no class token, no head; the primary output is
        the mean of the normed patch tokens."""
        T = transformers
        self.family("hf-siglip-nohead", T.SiglipVisionModel(
            T.SiglipVisionConfig(**self._VIT, vision_use_head=False)),
            lambda mm, x, s: mm(x, **_kw(s)).last_hidden_state.mean(dim=1))


@unittest.skipIf(torch is None or transformers is None, "needs torch and transformers")
class TestClipNamesGrads(HubGradCase):
    """CLIP's vision tower as open_clip / OpenAI (visual.*) and timm name it
    (test_clip_names.py's renames of an HF model's tensors): the same
    gradients under those names (visual.proj transposed)."""
    TMP_PREFIX = "vitc_grads_clipnames_"
    convert = None

    def named_grads(self, model, where):
        g = {k: torch.from_numpy(v) for k, v in super().named_grads(model, where).items()}
        return {k: v.numpy() for k, v in self.convert(g).items()}

    def names_case(self, name, convert):
        try:
            from .test_clip_names import to_openclip, to_timm
        except ImportError:  # run as a script
            from test_clip_names import to_openclip, to_timm
        import safetensors.torch
        T = transformers
        # open_clip's head width is 64: 128 wide, 2 heads
        model = perturb(T.CLIPVisionModelWithProjection(T.CLIPVisionConfig(
            hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
            image_size=32, patch_size=8, projection_dim=24, hidden_act="quick_gelu")), 1)
        d = self.path(name + "_hf")
        model.save_pretrained(d)
        sd = safetensors.torch.load_file(os.path.join(d, "model.safetensors"))
        self.convert = (lambda g: to_openclip(g, 2)) if convert == "open-clip" else (
            lambda g: to_timm(to_openclip(g, 2), 2))
        path = self.path(name + ".safetensors")
        vitc.save_safetensors(path, {k: v.numpy() for k, v in self.convert(sd).items()})
        # timm's head has a bias (zeros in the file, trained); HF's projection has none
        m = self.run_family(name, model, lambda mm, x, s: mm(x, **_kw(s)).image_embeds, path,
                            skip=("head.bias",))
        self.assertEqual(m.config["family"], convert)

    def test_open_clip_names(self):
        self.names_case("open-clip", "open-clip")

    def test_timm_clip_names(self):
        self.names_case("timm-clip", "timm-clip")


@unittest.skipIf(torch is None or timm is None, "needs torch and timm")
class TestTimmGrads(GradCase):
    """vit_tiny_patch16_224's architecture shrunk to a 32 px, 2-block model:
    a classifier, with layer scale (init_values), a backbone (num_classes=0).
    (Register tokens and the activation are not recorded in a timm file;
    the Hub's DINOv2 and CLIP cases above check those.)"""
    TMP_PREFIX = "vitc_grads_timm_"

    def named_grads(self, model, where):
        return {n: (p.grad if p.grad is not None else torch.zeros_like(p)).numpy()
                for n, p in model.named_parameters()}

    def family(self, name, **kw):
        args = dict(pretrained=False, img_size=32, patch_size=8, embed_dim=48, depth=2,
                    num_heads=3, mlp_ratio=2, num_classes=5)
        args.update(kw)
        model = perturb(timm.create_model("vit_tiny_patch16_224", **args), 2)
        # timm's names in a lone file; vitc.config gives what the shapes do not tell
        # (48 wide is not 64 per head)
        path = self.path(name + ".safetensors")
        vitc.save_safetensors(path, {n: t.detach().numpy() for n, t in model.state_dict().items()},
                              {"vitc.config": json.dumps({"num_heads": 3})})
        return self.run_family("timm " + name, model, lambda mm, x, s: mm(x), path, [SIZES[0]])

    def test_class_token(self):
        self.family("vit-tiny-cls")

    def test_layer_scale(self):
        self.family("vit-tiny-ls", init_values=0.5)

    def test_backbone(self):
        self.family("vit-tiny-backbone", num_classes=0)


st_write = t2t_ref = None
if torch is not None:
    try:
        from .util import reference_modules
    except ImportError:  # run as a script
        from util import reference_modules
    st_write, t2t_ref = reference_modules("st_write", "t2t_ref")


def _t2t_forward(sd, cfg, x):
    """tests/reference/t2t_ref.py's forward with autograd on: logits, or
    the class token after the final norm for a backbone."""
    import torch.nn.functional as F
    t = t2t_ref.tokens_to_token(sd, cfg, x)
    B, E, H = t.shape[0], cfg["embed_dim"], cfg["num_heads"]
    t = torch.cat([sd["cls_token"].expand(B, -1, -1), t], dim=1) + sd["pos_embed"]
    scale = cfg["qk_scale"] or (E // H) ** -0.5
    for i in range(cfg["depth"]):
        b = "blocks.%d." % i
        h = F.layer_norm(t, (E,), sd[b + "norm1.weight"], sd[b + "norm1.bias"], 1e-5)
        N = h.shape[1]
        qkv = F.linear(h, sd[b + "attn.qkv.weight"], sd.get(b + "attn.qkv.bias"))
        q, k, v = qkv.reshape(B, N, 3, H, E // H).permute(2, 0, 3, 1, 4)
        a = ((q @ k.transpose(-2, -1)) * scale).softmax(dim=-1)
        t = t + F.linear((a @ v).transpose(1, 2).reshape(B, N, E), sd[b + "attn.proj.weight"],
                         sd[b + "attn.proj.bias"])
        h = F.layer_norm(t, (E,), sd[b + "norm2.weight"], sd[b + "norm2.bias"], 1e-5)
        h = F.gelu(F.linear(h, sd[b + "mlp.fc1.weight"], sd[b + "mlp.fc1.bias"]))
        t = t + F.linear(h, sd[b + "mlp.fc2.weight"], sd[b + "mlp.fc2.bias"])
    h = F.layer_norm(t, (E,), sd["norm.weight"], sd["norm.bias"], 1e-5)
    if cfg["num_classes"]:
        return F.linear(h[:, 0], sd["head.weight"], sd["head.bias"])
    return h[:, 0]


@unittest.skipIf(torch is None, "needs torch")
class TestT2TGrads(TmpDirCase):
    """T2T-ViT's token-transformer mode (t2t_vit_t_*): tokens_to_token's
    stages, unfolds and projection, then the encoder, against autograd on
    tests/reference/t2t_ref.py's forward in float64 (pos_embed is the
    sinusoid constant: no gradient, as in the original)."""
    TMP_PREFIX = "vitc_grads_t2t_"

    def run_t2t(self, name, **kw):
        cfg = t2t_ref.t2t_config("transformer", img_size=64, embed_dim=48, depth=2, num_heads=3,
                                 mlp_ratio=2.0, token_dim=16, **kw)
        sd = t2t_ref.random_state(cfg, 4)
        path = self.path(name + ".safetensors")
        st_write.write(path, sd, t2t_ref.metadata(cfg))
        ref = {k: v.double().requires_grad_(k != "pos_embed") for k, v in sd.items()}
        m = vitc.load_model(path)
        m.train()
        x = np.random.RandomState(1).randn(2, 3, 64, 64).astype(np.float32)
        y = m(x)
        out = _t2t_forward(ref, cfg, torch.from_numpy(x).double())
        yr = out.detach().numpy()
        self.assertLessEqual(np.abs(y - yr).max(), RTOL * np.abs(yr).max() + ATOL, name + " output")
        dy = np.random.RandomState(2).randn(*y.shape).astype(np.float32)
        m.backward(dy)
        (out * torch.from_numpy(dy).double()).sum().backward()
        for n, g in m.grads().items():
            if n not in ref:  # qkv_bias=False: vitc's zero rows stay zero
                self.assertFalse(np.any(g), "T2T-ViT %s: %s has no torch tensor but a "
                                 "gradient" % (name, n))
                continue
            gr = ref[n].grad
            gr = np.zeros(g.shape) if gr is None else gr.numpy().reshape(g.shape)
            err, tol = np.abs(g - gr).max(), RTOL * np.abs(gr).max() + ATOL
            self.assertLessEqual(err, tol, "T2T-ViT %s: gradient of %s: max|vitc - torch| = %.3g, "
                                 "tolerance %.3g" % (name, n, err, tol))

    def test_t2t_transformer_classifier(self):
        self.run_t2t("t2t-t", num_classes=10)

    def test_t2t_transformer_backbone(self):
        self.run_t2t("t2t-t-backbone", num_classes=0)

    def test_t2t_performer_refused(self):
        cfg = t2t_ref.t2t_config("performer", img_size=64, embed_dim=48, depth=2, num_heads=3,
                                 mlp_ratio=2.0, token_dim=16, num_classes=10)
        path = self.path("t2t-p.safetensors")
        st_write.write(path, t2t_ref.random_state(cfg, 4), t2t_ref.metadata(cfg))
        m = vitc.load_model(path)
        m.train()
        y = m(np.zeros((1, 3, 64, 64), np.float32))
        with self.assertRaisesRegex(vitc.VitcError, "Token_performer"):
            m.backward(np.ones_like(y))


if __name__ == "__main__":
    unittest.main()
