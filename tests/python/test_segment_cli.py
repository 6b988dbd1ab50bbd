"""`vitc segment` end to end on real photos against transformers.

A small random-weight SamModel (hidden 32, input side 256, a 16 x 16
embedding) is saved with save_pretrained; the CLI's --raw logits (the masks
at the photo's size) must be within 1e-4 of max|ref| of SamModel +
SamProcessor.post_process_masks(binarize=False) for points, a box, points
with a box and two boxes, and its --json IoU within 1e-4 of SamModel's
iou_scores. --everything runs and its masks pass the thresholds and the
NMS; bad prompts and images exit non-zero with one error line, writing
nothing.
"""
import json
import os
import struct
import unittest

import numpy as np

try:
    from .util import TmpDirCase, VITC, run_vitc as run
except ImportError:  # run as a script
    from util import TmpDirCase, VITC, run_vitc as run

try:
    import torch
    from PIL import Image
    from transformers import SamConfig, SamModel, SamProcessor
    from transformers.models.sam.image_processing_pil_sam import SamImageProcessorPil
    import skimage
    PHOTOS = os.path.join(os.path.dirname(skimage.__file__), "data")
except ImportError:  # pragma: no cover
    torch = None

S = 256  # the small model's input side
TOL = 1e-4


def small_sam(seed=0):
    """A SamModel whose three parts agree on hidden size 32, with weights
    drawn as a trained model's look (non-zero biases, LayerNorms off
    identity, position tables non-zero)."""
    torch.manual_seed(seed)
    cfg = SamConfig(
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_dim=64,
                           image_size=S, patch_size=16, window_size=4, global_attn_indexes=[1],
                           output_channels=32, num_pos_feats=16),
        prompt_encoder_config=dict(hidden_size=32, image_size=S, patch_size=16,
                                   mask_input_channels=8),
        mask_decoder_config=dict(hidden_size=32, mlp_dim=64, num_attention_heads=2,
                                 iou_head_hidden_dim=24),
    )
    m = SamModel(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    embeddings = {n + ".weight" for n, mod in m.named_modules()
                  if isinstance(mod, torch.nn.Embedding)}
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "positional_embedding" in name:
                continue
            r = torch.randn(p.shape, generator=g)
            if "rel_pos" in name or "pos_embed" in name:
                p.copy_(0.5 * r)
            elif name in embeddings:
                p.copy_(r)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * r)
            elif p.dim() == 1:
                p.copy_(0.2 * r)
            else:
                p.copy_(r / np.sqrt(p[0].numel()))
    return m


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    hl = struct.unpack("<H", data[8:10])[0]
    header = data[10:10 + hl].decode()
    shape = tuple(int(x) for x in header.split("(")[1].split(")")[0].split(",") if x.strip())
    return np.frombuffer(data[10 + hl:], "<f4").reshape(shape)


def error_lines(err):
    return [l for l in err.splitlines() if l.startswith("vitc: error:")]


@unittest.skipIf(torch is None or not os.path.exists(VITC), "needs torch, skimage and build/vitc")
class TestSegmentCLI(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = small_sam()
        cls.dir = os.path.join(cls.tmp, "sam")
        cls.model.save_pretrained(cls.dir)
        ip = SamImageProcessorPil(size={"longest_edge": S}, pad_size={"height": S, "width": S})
        cls.proc = SamProcessor(image_processor=ip)
        cls.coffee = os.path.join(PHOTOS, "coffee.png")        # 600 x 400
        cls.astronaut = os.path.join(PHOTOS, "astronaut.png")  # 512 x 512
        cls.coffee_img = Image.open(cls.coffee).convert("RGB")

    def reference(self, points=None, labels=None, boxes=None, multimask=False):
        """SamModel + post_process_masks: masks [n, H, W] logits, iou [n]."""
        kw = {}
        if points is not None:
            kw["input_points"] = [[points]]
            kw["input_labels"] = [[labels]]
        if boxes is not None:
            kw["input_boxes"] = [boxes]
        inputs = self.proc(images=self.coffee_img, return_tensors="pt", **kw)
        if points is not None and boxes is not None and len(boxes) > 1:
            n = len(boxes)  # the points with each box, as the batched predictor
            inputs["input_points"] = inputs["input_points"].repeat(1, n, 1, 1)
            inputs["input_labels"] = inputs["input_labels"].repeat(1, n, 1)
        with torch.no_grad():
            out = self.model(pixel_values=inputs["pixel_values"],
                             input_points=inputs.get("input_points"),
                             input_labels=inputs.get("input_labels"),
                             input_boxes=inputs.get("input_boxes"), multimask_output=multimask)
        masks = self.proc.post_process_masks(out.pred_masks, inputs["original_sizes"],
                                             inputs["reshaped_input_sizes"], binarize=False)[0]
        H, W = self.coffee_img.height, self.coffee_img.width
        return (masks.reshape(-1, H, W).numpy(), out.iou_scores[0].reshape(-1).numpy())

    def segment(self, *args, image=None):
        out, raw = self.path("m.png"), self.path("m.npy")
        for p in (out, raw):
            if os.path.exists(p):
                os.remove(p)
        rc, so, se = run("segment", "--model", self.dir, "--out", out, "--raw", raw, "--json",
                         "--quiet", *args, image or self.coffee)
        self.assertEqual(rc, 0, se)
        return read_npy(raw), json.loads(so), out

    def check(self, args, **ref):
        masks, js, png = self.segment(*args)
        want, iou = self.reference(**ref)
        self.assertEqual(masks.shape, want.shape)
        err = np.abs(masks - want).max() / np.abs(want).max()
        self.assertLess(err, TOL, "masks: max|d|/max|ref| %g" % err)
        got = np.array(js["iou"], np.float32)
        self.assertEqual(got.shape, iou.shape)
        self.assertLess(np.abs(got - iou).max() / max(np.abs(iou).max(), 1e-3), TOL)
        self.assertEqual(js["image"], self.coffee)
        with Image.open(png) as im:
            self.assertEqual(im.size, self.coffee_img.size)
        return masks

    def test_points(self):
        self.check(["--point", "300,200", "--point", "100,350,0", "--multimask"],
                   points=[[300, 200], [100, 350]], labels=[1, 0], multimask=True)

    def test_box(self):
        self.check(["--box", "50,60,400,300"], boxes=[[50, 60, 400, 300]])

    def test_points_and_box(self):
        self.check(["--point=200,150", "--box=50,60,400,300", "--multimask"],
                   points=[[200, 150]], labels=[1], boxes=[[50, 60, 400, 300]], multimask=True)

    def test_two_boxes(self):
        m = self.check(["--box", "50,60,400,300", "--box", "300,10,590,390"],
                       boxes=[[50, 60, 400, 300], [300, 10, 590, 390]])
        self.assertEqual(m.shape[0], 2)

    def test_everything(self):
        out = self.path("all.png")
        rc, so, se = run("segment", "--model", self.dir, "--everything", "--points-per-side", "4",
                         "--pred-iou-thresh", "-10", "--stability-thresh", "0", "--json",
                         "--quiet", "--out", out, self.astronaut)
        self.assertEqual(rc, 0, se)
        js = json.loads(so)
        masks = js["masks"]
        self.assertTrue(masks, "no mask passed thresholds this low")
        ious = [m["predicted_iou"] for m in masks]
        self.assertEqual(ious, sorted(ious, reverse=True))
        boxes = []
        for m in masks:
            self.assertGreater(m["predicted_iou"], -10)
            self.assertGreaterEqual(m["stability_score"], 0.0)
            x, y, w, h = m["bbox"]
            self.assertTrue(0 <= x and 0 <= y and x + w < 512 and y + h < 512)
            self.assertGreater(m["area"], 0)
            boxes.append((x, y, x + w, y + h))
        for i in range(len(boxes)):  # the NMS: no two boxes overlap above 0.7
            for j in range(i):
                a, b = boxes[i], boxes[j]
                iw = max(0, min(a[2], b[2]) - max(a[0], b[0]))
                ih = max(0, min(a[3], b[3]) - max(a[1], b[1]))
                ua = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
                self.assertLessEqual(iw * ih, 0.7 * ua + 1e-9)
        with Image.open(out) as im:
            self.assertEqual(im.size, (512, 512))
        # the defaults (0.88, 0.95) on random weights: it runs, whatever it keeps
        rc, so, se = run("segment", "--model", self.dir, "--everything", "--points-per-side", "2",
                         "--json", "--quiet", "--out", out, self.astronaut)
        self.assertEqual(rc, 0, se)
        for m in json.loads(so)["masks"]:
            self.assertGreater(m["predicted_iou"], 0.88)
            self.assertGreaterEqual(m["stability_score"], 0.95)

    def test_mask_input(self):
        masks, js, _ = self.segment("--point", "300,200")
        low = self.path("low.npy")
        np.save(low, np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32))
        masks2, _, _ = self.segment("--point", "300,200", "--mask-input", low)
        self.assertEqual(masks2.shape, masks.shape)
        self.assertGreater(np.abs(masks2 - masks).max(), 1e-3)  # the mask prompt matters

    def refused(self, args, needle, image=None, code=None):
        out, raw = self.path("bad.png"), self.path("bad.npy")
        rc, so, se = run("segment", "--model", self.dir, "--out", out, "--raw", raw, *args,
                         image or self.coffee)
        self.assertNotEqual(rc, 0, args)
        if code is not None:
            self.assertEqual(rc, code, se)
        lines = error_lines(se)
        self.assertEqual(len(lines), 1, se)
        self.assertIn(needle, lines[0])
        self.assertFalse(os.path.exists(out), args)
        self.assertFalse(os.path.exists(raw), args)

    def test_bad_input(self):
        self.refused(["--point", "601,10"], "outside the 600x400 image", code=1)
        self.refused(["--point", "10,-1"], "outside", code=1)
        self.refused(["--point", "nan,10"], "--point", code=2)
        self.refused(["--point", "10,10,2"], "label 2", code=2)
        self.refused(["--point", "10,10,"], "--point", code=2)
        self.refused(["--box", "10,10,10,50"], "no area", code=1)
        self.refused(["--box", "100,10,50,50"], "no area", code=1)
        self.refused(["--box", "10,10,50,401"], "outside", code=1)
        self.refused(["--box", "10,10,50"], "--box", code=2)
        many = []
        for i in range(1001):
            many += ["--point", "%d,%d" % (i % 600, i % 400)]
        self.refused(many, "at most 1000", code=2)
        wrong = self.path("wrong.npy")
        np.save(wrong, np.zeros((256, 256), np.float32))  # this model's is 64 x 64
        self.refused(["--point", "10,10", "--mask-input", wrong], "[64, 64]", code=1)
        tiny = self.path("tiny.png")
        Image.new("RGB", (1, 1), (10, 20, 30)).save(tiny)
        self.refused(["--point", "0,0"], "1x1", image=tiny, code=1)
        self.refused([], "no prompt", code=2)
        # an --out the writer refuses: found before --raw is written
        rc, _, se = run("segment", "--model", self.dir, "--out", self.tmp, "--raw",
                        self.path("bad.npy"), "--point", "1,1", self.coffee)
        self.assertEqual(rc, 1)
        self.assertEqual(len(error_lines(se)), 1, se)
        self.assertFalse(os.path.exists(self.path("bad.npy")))
        self.refused(["--everything", "--point", "1,1"], "--everything", code=2)


if __name__ == "__main__":
    unittest.main()
