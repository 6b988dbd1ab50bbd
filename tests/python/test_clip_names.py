"""CLIP's vision tower in open_clip's / OpenAI's names (visual.*: conv1,
class_embedding, positional_embedding, ln_pre, transformer.resblocks.N
{ln_1, attn.in_proj_*, attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}, ln_post,
proj [width, embed] applied as x @ proj) and in timm's
(vit_base_patch16_clip_224.openai: norm_pre, blocks.N, norm, head), as lone
.safetensors files and as Hub directories, against an OpenAI-layout torch
forward (nn.MultiheadAttention) and tests/reference/hf_ref.py's CLIP forward
at the same weights. Quick-GELU for OpenAI weights (no config, open_clip's
quick_gelu, timm's *quickgelu* / openai tag), GELU where the config says.

Needs torch (the .venv that scripts/install-deps.sh makes); skipped without.
"""
import json
import os
import unittest

import numpy as np

import vitc

try:
    from .util import (PHOTO, VITC, TmpDirCase, assert_close as close, random_images,
                       reference_modules, run_vitc as run, torch, write_json)
except ImportError:  # run as a script
    from util import (PHOTO, VITC, TmpDirCase, assert_close as close, random_images,
                      reference_modules, run_vitc as run, torch, write_json)
if torch is not None:
    import torch.nn.functional as F
hf_ref, st_write = reference_modules("hf_ref", "st_write")


def to_openclip(sd, L):
    """HF CLIP names -> open_clip / OpenAI (timm's _convert_openai_clip in reverse)."""
    e, v = "vision_model.embeddings.", "vision_model."
    o = {"visual.class_embedding": sd[e + "class_embedding"],
         "visual.conv1.weight": sd[e + "patch_embedding.weight"],
         "visual.positional_embedding": sd[e + "position_embedding.weight"],
         "visual.ln_pre.weight": sd[v + "pre_layrnorm.weight"],
         "visual.ln_pre.bias": sd[v + "pre_layrnorm.bias"],
         "visual.ln_post.weight": sd[v + "post_layernorm.weight"],
         "visual.ln_post.bias": sd[v + "post_layernorm.bias"],
         "visual.proj": sd["visual_projection.weight"].t().contiguous()}
    for i in range(L):
        h, r = v + "encoder.layers.%d." % i, "visual.transformer.resblocks.%d." % i
        a = h + "self_attn."
        o[r + "attn.in_proj_weight"] = torch.cat([sd[a + n + "_proj.weight"] for n in "qkv"])
        o[r + "attn.in_proj_bias"] = torch.cat([sd[a + n + "_proj.bias"] for n in "qkv"])
        for src, dst in [("self_attn.out_proj", "attn.out_proj"), ("layer_norm1", "ln_1"),
                         ("layer_norm2", "ln_2"), ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")]:
            o[r + dst + ".weight"] = sd[h + src + ".weight"]
            o[r + dst + ".bias"] = sd[h + src + ".bias"]
    return o


def to_timm(oc, L):
    """open_clip names -> timm's (_convert_openai_clip)."""
    t = {"cls_token": oc["visual.class_embedding"][None, None],
         "patch_embed.proj.weight": oc["visual.conv1.weight"],
         "pos_embed": oc["visual.positional_embedding"][None],
         "norm_pre.weight": oc["visual.ln_pre.weight"], "norm_pre.bias": oc["visual.ln_pre.bias"],
         "norm.weight": oc["visual.ln_post.weight"], "norm.bias": oc["visual.ln_post.bias"],
         "head.weight": oc["visual.proj"].t().contiguous(),
         "head.bias": torch.zeros(oc["visual.proj"].shape[1])}
    for i in range(L):
        r, b = "visual.transformer.resblocks.%d." % i, "blocks.%d." % i
        for src, dst in [("attn.in_proj_weight", "attn.qkv.weight"), ("attn.in_proj_bias", "attn.qkv.bias"),
                         ("attn.out_proj.weight", "attn.proj.weight"), ("attn.out_proj.bias", "attn.proj.bias"),
                         ("ln_1.weight", "norm1.weight"), ("ln_1.bias", "norm1.bias"),
                         ("ln_2.weight", "norm2.weight"), ("ln_2.bias", "norm2.bias"),
                         ("mlp.c_fc.weight", "mlp.fc1.weight"), ("mlp.c_fc.bias", "mlp.fc1.bias"),
                         ("mlp.c_proj.weight", "mlp.fc2.weight"), ("mlp.c_proj.bias", "mlp.fc2.bias")]:
            t[b + dst] = oc[r + src]
    return t


@torch.no_grad()
def openai_forward(oc, heads, quick, px):
    """OpenAI CLIP's VisionTransformer (LND layout, nn.MultiheadAttention,
    x @ proj): (image_embeds, the un-normed last tokens [B, N, W])."""
    w = oc["visual.conv1.weight"]
    W, P = w.shape[0], w.shape[2]
    act = (lambda t: t * torch.sigmoid(1.702 * t)) if quick else F.gelu
    x = F.conv2d(px, w, stride=P).reshape(px.shape[0], W, -1).permute(0, 2, 1)
    cls = oc["visual.class_embedding"] + torch.zeros(x.shape[0], 1, W)
    x = torch.cat([cls, x], dim=1) + oc["visual.positional_embedding"]
    ln = lambda t, p: F.layer_norm(t, (W,), oc[p + ".weight"], oc[p + ".bias"], 1e-5)  # noqa: E731
    x = ln(x, "visual.ln_pre").permute(1, 0, 2)
    i = 0
    while "visual.transformer.resblocks.%d.ln_1.weight" % i in oc:
        r = "visual.transformer.resblocks.%d." % i
        mha = torch.nn.MultiheadAttention(W, heads)
        mha.load_state_dict({"in_proj_weight": oc[r + "attn.in_proj_weight"],
                             "in_proj_bias": oc[r + "attn.in_proj_bias"],
                             "out_proj.weight": oc[r + "attn.out_proj.weight"],
                             "out_proj.bias": oc[r + "attn.out_proj.bias"]})
        h = ln(x, r + "ln_1")
        x = x + mha(h, h, h, need_weights=False)[0]
        h = F.linear(ln(x, r + "ln_2"), oc[r + "mlp.c_fc.weight"], oc[r + "mlp.c_fc.bias"])
        x = x + F.linear(act(h), oc[r + "mlp.c_proj.weight"], oc[r + "mlp.c_proj.bias"])
        i += 1
    x = x.permute(1, 0, 2)
    return ln(x[:, 0], "visual.ln_post") @ oc["visual.proj"], x


def text_tower(g):
    """What an open_clip / OpenAI checkpoint holds beside the image tower."""
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    b = "transformer.resblocks.0."
    return {"token_embedding.weight": r(10, 8), "positional_embedding": r(7, 8),
            b + "ln_1.weight": r(8), b + "ln_1.bias": r(8),
            b + "attn.in_proj_weight": r(24, 8), b + "attn.in_proj_bias": r(24),
            b + "attn.out_proj.weight": r(8, 8), b + "attn.out_proj.bias": r(8),
            b + "ln_2.weight": r(8), b + "ln_2.bias": r(8),
            b + "mlp.c_fc.weight": r(32, 8), b + "mlp.c_fc.bias": r(32),
            b + "mlp.c_proj.weight": r(8, 32), b + "mlp.c_proj.bias": r(8),
            "ln_final.weight": r(8), "ln_final.bias": r(8),
            "text_projection": r(8, 16), "logit_scale": torch.tensor(4.6)}


@unittest.skipIf(torch is None, "needs torch")
class TestClipNames(TmpDirCase):
    TMP_PREFIX = "vitc_clipnames_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.x = random_images(torch.Generator().manual_seed(3), [(32, 32), (40, 24)])

    def weights(self, hidden, heads, act, seed):
        cfg = hf_ref.clip_config("clip_vision_model", hidden=hidden, heads=heads, mlp=2 * hidden,
                                 act=act)
        sd, _ = hf_ref.clip_random_state(cfg, seed, text=False, position_ids=False)
        return cfg, sd, to_openclip(sd, cfg["num_hidden_layers"])

    def check(self, m, cfg, sd, oc, heads, quick, timm=False):
        for s, x in self.x.items():
            what = "%s %s" % (m.config["family"], s)
            hidden, pooled, emb = hf_ref.clip_forward(sd, cfg, x)
            close(self, m.embed(x.numpy()), emb, what + " image_embeds (HF reference)")
            close(self, m.embed(x.numpy(), pool="cls"), pooled, what + " pooler_output")
            if timm:  # timm's norm on every token
                D = cfg["hidden_size"]
                h = F.layer_norm(hidden, (D,), sd["vision_model.post_layernorm.weight"],
                                 sd["vision_model.post_layernorm.bias"], 1e-5)
                close(self, m.forward_features(x.numpy()), h, what + " features")
            else:
                close(self, m.forward_features(x.numpy()), hidden, what + " last_hidden_state")
            if s == (32, 32):  # the OpenAI layout forward (native size: no resampling)
                e2, _ = openai_forward(oc, heads, quick, x)
                close(self, m.embed(x.numpy()), e2, what + " image_embeds (OpenAI layout)")
        self.assertFalse(m.config["has_head"])

    def test_open_clip_file_no_config_quick_gelu(self):
        cfg, sd, oc = self.weights(128, 2, "quick_gelu", 1)
        t = dict(oc)
        t.update(text_tower(torch.Generator().manual_seed(9)))
        p = os.path.join(self.tmp, "ViT-tiny.safetensors")
        st_write.write(p, t)
        m = vitc.load_model(p)
        self.assertEqual(m.config["family"], "open-clip")
        # the text tower is read (test_text_tower checks its numbers), no longer ignored
        self.assertEqual((m.has_text, m.text_dim), (True, 16))
        self.assertNotIn("logit_scale", m.config["ignored"])
        self.assertNotIn("transformer.resblocks.0.attn.in_proj_weight", m.config["ignored"])
        self.check(m, cfg, sd, oc, 2, True)

    def test_open_clip_dir_gelu_head_width(self):
        cfg, sd, oc = self.weights(48, 3, "gelu", 2)
        d = self.path("open_clip_dir")
        write_json(os.path.join(d, "open_clip_config.json"), {"model_cfg": {
            "embed_dim": 16, "vision_cfg": {
                "image_size": 32, "layers": 2, "width": 48, "head_width": 16, "patch_size": 8}},
            "preprocess_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}})
        st_write.write(os.path.join(d, "open_clip_model.safetensors"), oc)
        m = vitc.load_model(d)
        self.assertEqual(m.config["mean"], [0.5] * 3)
        self.check(m, cfg, sd, oc, 3, False)

    def test_timm_file_and_dir(self):
        cfg, sd, oc = self.weights(128, 2, "quick_gelu", 4)
        d = self.path("timm_dir")
        write_json(os.path.join(d, "config.json"), {
            "architecture": "vit_base_patch16_clip_224", "num_classes": 16,
            "pretrained_cfg": {"tag": "openai", "input_size": [3, 32, 32]}})
        st_write.write(os.path.join(d, "model.safetensors"), to_timm(oc, 2))
        for path in (d, os.path.join(d, "model.safetensors")):
            m = vitc.load_model(path)
            self.assertEqual(m.config["family"], "timm-clip")
            self.assertEqual(m.config["arch"], "vit_base_patch16_clip_224")
            self.check(m, cfg, sd, oc, 2, True, timm=True)
        # a LAION tag: GELU, other numbers (the activation is read)
        write_json(os.path.join(d, "config.json"), {"architecture": "vit_base_patch16_clip_224",
                                                    "pretrained_cfg": {"tag": "laion2b_s34b_b88k"}})
        g = vitc.load_model(d)
        x = self.x[(32, 32)].numpy()
        self.assertGreater(np.abs(g.embed(x) - m.embed(x)).max(), 1e-3)

    def test_malformed(self):
        cfg, sd, oc = self.weights(64, 1, "quick_gelu", 5)
        bad = dict(oc)
        del bad["visual.transformer.resblocks.1.mlp.c_proj.weight"]
        p = os.path.join(self.tmp, "bad1.safetensors")
        st_write.write(p, bad)
        with self.assertRaisesRegex(vitc.VitcError, "visual.transformer.resblocks.1.mlp.c_proj.weight"):
            vitc.load_model(p)
        bad = dict(oc)
        bad["visual.proj"] = bad["visual.proj"].t().contiguous()
        st_write.write(p, bad)
        with self.assertRaisesRegex(vitc.VitcError, "visual.proj"):
            vitc.load_model(p)
        bad = dict(oc)
        bad["visual.transformer.resblocks.0.ls_1.gamma"] = torch.ones(64)
        st_write.write(p, bad)
        with self.assertRaisesRegex(vitc.VitcError, "unexpected tensor visual.transformer.resblocks.0.ls_1"):
            vitc.load_model(p)

    @unittest.skipIf(not os.path.exists(VITC), "needs build/vitc")
    def test_cli_inspect_embed(self):
        cfg, sd, oc = self.weights(128, 2, "quick_gelu", 6)
        p = os.path.join(self.tmp, "cli.safetensors")
        st_write.write(p, oc)
        rc, out, err = run("inspect", p)
        self.assertEqual(rc, 0, err)
        self.assertIn("open-clip", out)
        rc, out, err = run("embed", "--model", p, "--json", "--quiet", PHOTO)
        self.assertEqual(rc, 0, err)
        m = vitc.load_model(p)
        want = m.embed(m.preprocess(PHOTO)[None])[0]
        close(self, json.loads(out)["embedding"], want, "vitc embed")


if __name__ == "__main__":
    unittest.main()
