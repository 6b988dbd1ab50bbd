"""SAM's image encoder in bf16 and int8 (vitc.Sam(path, precision=...), over
vitc_sam_load_precision) against fp32, on the real photos (scikit-image's
coffee and astronaut), with a random-weight SamModel saved from a config.

fp32 is first checked against transformers' SamModel.get_image_embeddings
(its row-major weights are given back once packed, so this also shows the
packs are what the forward reads), and again after the kernel path moved
under the loaded model (an fp32 pack made for another kernel is unpacked
per call). Then the embeddings of bf16 / int8 (max|d| / max|ref|) and the
thresholded masks' IoU against fp32's for point and box prompts; the
numbers are printed and stated in docs/segment.md ("Precision").
"""
import os
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
import vitc  # noqa: E402
from vitc import _lib  # noqa: E402
try:
    from .util import VITC, run_vitc
except ImportError:
    from util import VITC, run_vitc

try:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import SamConfig, SamModel, SamProcessor
    from transformers.models.sam.image_processing_pil_sam import SamImageProcessorPil
    from PIL import Image
    import skimage
    PHOTOS = os.path.join(os.path.dirname(skimage.__file__), "data")
except ImportError:  # pragma: no cover
    torch = None

S = 256
PHOTO_NAMES = ("coffee.png", "astronaut.png")
# Bounds with margin over what was measured (docs/segment.md): embeddings
# as max|d| / max|ref|, masks as the IoU of the > 0 regions.
EMB_BOUND = {"bf16": 0.03, "int8": 0.06}
IOU_BOUND = {"bf16": 0.95, "int8": 0.90}


def rel_err(got, ref):
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def iou(a, b):
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def prompts(h, w):
    """Points (one, and a foreground + background pair) and boxes in the
    image's pixels."""
    return [
        dict(points=[[0.5 * w, 0.5 * h]], labels=[1]),
        dict(points=[[0.3 * w, 0.35 * h]], labels=[1]),
        dict(points=[[0.7 * w, 0.6 * h], [0.2 * w, 0.8 * h]], labels=[1, 0]),
        dict(box=[0.1 * w, 0.15 * h, 0.6 * w, 0.7 * h]),
        dict(box=[0.4 * w, 0.3 * h, 0.95 * w, 0.9 * h]),
    ]


@unittest.skipIf(torch is None, "needs torch, transformers, PIL, safetensors and scikit-image")
class TestSamPrecision(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cfg = SamConfig(
            vision_config=dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                               mlp_dim=512, image_size=S, patch_size=16, window_size=6,
                               global_attn_indexes=[1, 3], output_channels=64,
                               num_pos_feats=32),
            prompt_encoder_config=dict(hidden_size=64, image_size=S, patch_size=16,
                                       mask_input_channels=8),
            mask_decoder_config=dict(hidden_size=64, mlp_dim=128, num_attention_heads=2,
                                     iou_head_hidden_dim=32))
        torch.manual_seed(0)
        cls.model = SamModel(cfg).eval()
        # every weight drawn (the default init zeroes biases and keeps the
        # LayerNorms at identity, which would make easy masks)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for n, p in cls.model.named_parameters():
                r = torch.randn(p.shape, generator=g)
                if "layer_norm" in n and n.endswith("weight"):
                    p.copy_(1.0 + 0.2 * r)
                elif "rel_pos" in n or "pos_embed" in n or "positional" in n:
                    p.copy_(0.5 * r)
                elif p.dim() == 1:
                    p.copy_(0.2 * r)
                else:
                    p.copy_(r / np.sqrt(p[0].numel()))
        cls.dir = tempfile.TemporaryDirectory()
        cls.model.save_pretrained(cls.dir.name)
        cls.sams = {p: vitc.Sam(cls.dir.name, precision=p) for p in ("fp32", "bf16", "int8")}

    @classmethod
    def tearDownClass(cls):
        for s in cls.sams.values():
            s.close()
        cls.dir.cleanup()

    def test_fp32_matches_transformers_and_survives_a_path_switch(self):
        proc = SamProcessor(image_processor=SamImageProcessorPil(
            size={"longest_edge": S}, pad_size={"height": S, "width": S}))
        path = os.path.join(PHOTOS, "coffee.png")
        inp = proc(images=Image.open(path).convert("RGB"), return_tensors="pt")
        with torch.no_grad():
            ref = self.model.get_image_embeddings(inp["pixel_values"])[0].numpy()
        pred = vitc.SamPredictor(self.sams["fp32"])
        pred.set_image(path)
        self.assertLess(rel_err(pred.embedding, ref), 1e-5)
        # the packs were made for the path in use at load; another kernel,
        # or OpenBLAS, after loading must not read the given-back copies
        switches = [(_lib.lib.vitc_set_arch, b"generic"),
                    (_lib.lib.vitc_set_gemm_backend, b"openblas")]
        done = 0
        for setter, name in switches:
            if setter(name) != 0:
                continue  # not on this CPU / build
            try:
                pred.set_image(path)
                switched = pred.embedding
            finally:
                setter(None)
            done += 1
            with self.subTest(switch=name.decode()):
                self.assertLess(rel_err(switched, ref), 1e-5)
        if not done:
            self.skipTest("no other kernel path or GEMM backend to switch to")

    def test_bf16_and_int8_against_fp32_on_photos(self):
        preds = {p: vitc.SamPredictor(s) for p, s in self.sams.items()}
        emb_err = {"bf16": 0.0, "int8": 0.0}
        ious = {"bf16": [], "int8": []}
        fractions = []
        for name in PHOTO_NAMES:
            path = os.path.join(PHOTOS, name)
            for p in preds.values():
                p.set_image(path)
            ref_emb = preds["fp32"].embedding
            h, w = preds["fp32"].original_size
            for prec in ("bf16", "int8"):
                emb_err[prec] = max(emb_err[prec], rel_err(preds[prec].embedding, ref_emb))
            for pr in prompts(h, w):
                ref, _, _ = preds["fp32"].predict(multimask_output=True, **pr)
                fractions += [float(m.mean()) for m in ref]
                for prec in ("bf16", "int8"):
                    got, _, _ = preds[prec].predict(multimask_output=True, **pr)
                    ious[prec] += [iou(a, b) for a, b in zip(got, ref)]
        # the masks are neither empty nor the whole image, else IoU says nothing
        self.assertGreater(np.median(fractions), 0.02)
        self.assertLess(np.median(fractions), 0.98)
        for prec in ("bf16", "int8"):
            lo, mean = min(ious[prec]), float(np.mean(ious[prec]))
            print("\n  SAM %s vs fp32 on %s: embedding max|d|/max|ref| %.2e; mask IoU min %.4f "
                  "mean %.4f over %d masks (median mask area %.0f%%)"
                  % (prec, "/".join(PHOTO_NAMES), emb_err[prec], lo, mean, len(ious[prec]),
                     100 * np.median(fractions)), file=sys.stderr)
            self.assertGreater(emb_err[prec], 0.0)  # really another precision
            self.assertLess(emb_err[prec], EMB_BOUND[prec])
            self.assertGreater(lo, IOU_BOUND[prec])

    @unittest.skipIf(not os.path.exists(VITC), "needs build/vitc")
    def test_cli_precision(self):
        """vitc segment --precision int8 --raw: the binding's int8 logits;
        a precision it does not know is a usage error, nothing written."""
        path = os.path.join(PHOTOS, "coffee.png")
        with tempfile.TemporaryDirectory() as d:
            out, raw = os.path.join(d, "m.png"), os.path.join(d, "m.npy")
            rc, _, err = run_vitc("segment", "--model", self.dir.name, "--precision", "int8",
                                  "--point", "300,200", "--quiet", "--out", out, "--raw", raw,
                                  path)
            self.assertEqual(rc, 0, err)
            pred = vitc.SamPredictor(self.sams["int8"])
            pred.set_image(path)
            ref, _, _ = pred.predict(points=[[300.0, 200.0]], labels=[1],
                                     multimask_output=False, return_logits=True)
            np.testing.assert_array_equal(np.load(raw), ref)
            bad = os.path.join(d, "bad.png")
            rc, _, err = run_vitc("segment", "--model", self.dir.name, "--precision", "fp16",
                                  "--point", "300,200", "--out", bad, path)
            self.assertEqual(rc, 2)
            self.assertIn("--precision must be fp32, bf16 or int8", err)
            self.assertFalse(os.path.exists(bad))

    def test_bad_precision_and_int8_nan_are_one_line_errors(self):
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.Sam(self.dir.name, precision="fp16")
        self.assertIn("fp16", str(cm.exception))
        self.assertNotIn("\n", str(cm.exception))
        with tempfile.TemporaryDirectory() as d:
            t = load_file(os.path.join(self.dir.name, "model.safetensors"))
            t["vision_encoder.layers.2.mlp.lin1.weight"][3, 5] = float("nan")
            save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
            with open(os.path.join(self.dir.name, "config.json")) as f, \
                    open(os.path.join(d, "config.json"), "w") as g:
                g.write(f.read())
            with self.assertRaises(vitc.VitcError) as cm:
                vitc.Sam(d, precision="int8")
            msg = str(cm.exception)
            self.assertIn("layers.2.mlp.lin1", msg)
            self.assertIn("NaN", msg)
            vitc.Sam(d, precision="bf16").close()  # bf16 carries it


if __name__ == "__main__":
    unittest.main()
