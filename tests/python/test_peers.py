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

TOL = 1e-5


def rel_err(got, ref):
    """max|got - ref| / max|ref| over the whole output."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def perturb(model, seed):
    """Every floating parameter moved by seeded noise, so that no tensor is
    left at an initialiser's zero or one (biases, heads, class and
    register tokens, layer scale) and a wrongly mapped one shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if not p.dtype.is_floating_point:
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
        model.save_pretrained(whole)
        model.save_pretrained(sharded, max_shard_size="40KB")
        self.assertTrue(os.path.exists(os.path.join(whole, "model.safetensors")), name)
        with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
            shards = set(json.load(f)["weight_map"].values())
        self.assertGreater(len(shards), 1, "%s: save_pretrained did not shard" % name)
        return whole, sharded

    def run_family(self, family, model, outputs, sizes, interpolate=True, seed=0):
        """outputs: [(name, ref(model, x, interpolate) -> tensor, got(vitc model, x))]
        compared at every size for the whole and the sharded directory."""
        perturb(model, seed)
        whole, sharded = self.save_both(model, family)
        xs = _hf_images(sizes, seed + 100)
        refs = {}
        with torch.no_grad():
            for s, x in xs.items():
                for name, ref, _ in outputs:
                    refs[s, name] = ref(model, x, interpolate and s != sizes[0])
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
        base = model.base_model
        outs = [("last_hidden_state vs forward_features",
                 lambda mm, x, i: mm.base_model(x, **self._kw(i)).last_hidden_state,
                 lambda m, x: m.forward_features(x)),
                ("layernormed class token vs embed(default)",
                 lambda mm, x, i: mm.base_model(x, **self._kw(i)).last_hidden_state[:, 0],
                 lambda m, x: m.embed(x))]
        if logits:
            outs.append(("logits vs m(x)", lambda mm, x, i: mm(x, **self._kw(i)).logits,
                         lambda m, x: m(x)))
        del base
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
        outs = [("last_hidden_state vs forward_features",
                 lambda mm, x, i: mm(x).last_hidden_state, lambda m, x: m.forward_features(x)),
                ("pooler_output vs embed(default)",
                 lambda mm, x, i: mm(x).pooler_output, lambda m, x: m.embed(x))]
        # DINOv2 resamples at every size, the config's included.
        return self.run_family(family, model, outs, [(32, 32), (32, 48), (40, 40)])

    def test_dinov2(self):
        self._dinov2(transformers.Dinov2Model, "hf-dinov2")

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

    def test_clip_model(self):
        text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, vocab_size=99, max_position_embeddings=16,
                    projection_dim=24)
        model = transformers.CLIPModel(transformers.CLIPConfig(
            text_config=text, vision_config=self._clip_vision("quick_gelu"), projection_dim=24))

        def features(mm, x, i):
            out = mm.get_image_features(pixel_values=x, **self._kw(i))
            return getattr(out, "pooler_output", out)
        outs = [("get_image_features vs embed(default)", features, lambda m, x: m.embed(x)),
                ("vision_model.last_hidden_state vs forward_features",
                 lambda mm, x, i: mm.vision_model(x, **self._kw(i)).last_hidden_state,
                 lambda m, x: m.forward_features(x)),
                ("vision_model.pooler_output vs embed(cls)",
                 lambda mm, x, i: mm.vision_model(x, **self._kw(i)).pooler_output,
                 lambda m, x: m.embed(x, pool="cls"))]
        m = self.run_family("hf-clip-model", model, outs, [(32, 32), (32, 48)])
        self.assertTrue(any(n.startswith("text_model.") for n in m.config["ignored"]))

    def test_siglip_vision(self):
        model = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(
            hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=96,
            image_size=32, patch_size=8))
        outs = [("last_hidden_state vs forward_features",
                 lambda mm, x, i: mm(x, **self._kw(i)).last_hidden_state,
                 lambda m, x: m.forward_features(x)),
                ("pooler_output (MAP head) vs embed(default)",
                 lambda mm, x, i: mm(x, **self._kw(i)).pooler_output, lambda m, x: m.embed(x))]
        self.run_family("hf-siglip-vision", model, outs, [(32, 32), (32, 48)])


if __name__ == "__main__":
    unittest.main()
