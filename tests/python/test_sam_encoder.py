"""SAM's image encoder (vitc.Sam / vitc.SamPredictor over vitc_sam_load and
vitc_sam_set_image) against transformers' SamModel.get_image_embeddings and
the original segment-anything image_encoder, with random weights.

Small configs cover the structure: windows that need padding, global
blocks, no qkv bias, no relative or absolute positions, window_size 0,
another activation. The position tables are drawn non-zero (both libraries
initialise them to zeros, which would hide a wrong index). One ViT-B run
at 1024 x 1024 on a real photo checks tools/convert_sam.py, the released
config and SamProcessor's preprocessing together. The predictor's
predict (the binding over vitc_sam_predict) is checked end to end against
SamProcessor + SamModel + post_process_masks.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
import vitc  # noqa: E402

try:
    import torch
    from PIL import Image
    from safetensors.torch import load_file, save_file
    from transformers import SamConfig, SamModel, SamProcessor
    from transformers.models.sam.image_processing_pil_sam import SamImageProcessorPil
    import skimage
    PHOTOS = os.path.join(os.path.dirname(skimage.__file__), "data")
except ImportError:  # pragma: no cover
    torch = None
try:
    from segment_anything import sam_model_registry
except ImportError:  # pragma: no cover
    sam_model_registry = None

TOL = 1e-5  # max|d| / max|ref| of the embeddings


def rel_err(got, ref):
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def perturb_positions(model, std=0.5):
    """Non-zero position tables (both libraries start them at zeros)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "rel_pos" in n or "pos_embed" in n:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def make_sam(d, vision, init=0, **save):
    """A random-weight SamModel of this vision config saved into d."""
    torch.manual_seed(init)
    m = SamModel(SamConfig(vision_config=vision)).eval()
    perturb_positions(m)
    m.save_pretrained(d, **save)
    return m


def first_line_only(test, err):
    msg = str(err)
    test.assertTrue(msg, "empty error message")
    test.assertNotIn("\n", msg)
    return msg


SMALL = {
    # grid 10, windows of 4: padded to 12 (3 x 3 windows), one global block
    "padded_windows": dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4, mlp_dim=192,
                           image_size=160, patch_size=16, window_size=4, global_attn_indexes=[1],
                           output_channels=32),
    # grid 14, windows of 5 (padded to 15), two global blocks, no qkv bias (the
    # padded tokens' q, k, v are zeros then), an output wider than the blocks
    "no_qkv_bias": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=6, mlp_dim=300,
                        image_size=224, patch_size=16, window_size=5, global_attn_indexes=[0, 3],
                        output_channels=256, qkv_bias=False),
    # patch 8 on 128 (grid 16, windows 7 -> 21), no positions at all, tanh GELU
    "no_positions": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, mlp_dim=256,
                         image_size=128, patch_size=8, window_size=7, global_attn_indexes=[],
                         output_channels=64, use_rel_pos=False, use_abs_pos=False,
                         hidden_act="gelu_pytorch_tanh"),
    # window_size 0: every block global
    "all_global": dict(hidden_size=96, num_hidden_layers=2, num_attention_heads=3, mlp_dim=128,
                       image_size=96, patch_size=16, window_size=0, global_attn_indexes=[],
                       output_channels=32),
}


def decoder_missing():
    """Loading needs the prompt side (src/models/sam_decoder.c) too: while it
    is a placeholder, a SamModel cannot be loaded at all."""
    if torch is None:
        return False
    with tempfile.TemporaryDirectory() as d:
        make_sam(d, SMALL["all_global"])
        try:
            vitc.Sam(d)
        except vitc.VitcError as e:
            return "decoder is not built" in str(e)
    return False


NO_DECODER = decoder_missing()


@unittest.skipIf(torch is None, "needs torch, transformers, PIL, safetensors and scikit-image")
@unittest.skipIf(NO_DECODER, "SAM's mask decoder is not in this build: vitc_sam_load refuses")
class TestSamEncoder(unittest.TestCase):
    def test_small_configs_match_transformers(self):
        for name, vision in SMALL.items():
            with self.subTest(config=name), tempfile.TemporaryDirectory() as d:
                m = make_sam(d, vision)
                S = vision["image_size"]
                px = torch.randn(1, 3, S, S, generator=torch.Generator().manual_seed(2))
                with torch.no_grad():
                    ref = m.get_image_embeddings(px)[0].numpy()
                sam = vitc.Sam(d)
                self.assertEqual(sam.input_size, S)
                self.assertEqual(sam.embedding_shape, ref.shape)
                p = vitc.SamPredictor(sam)
                p.set_image_tensor(px[0].numpy(), (S, S))
                got = p.embedding
                self.assertEqual(got.shape, ref.shape)
                self.assertLess(rel_err(got, ref), TOL, name)

    def test_sharded_directory(self):
        """A shard index (model.safetensors.index.json) read as one file; the
        path may also name the directory's config.json or the index."""
        vision = SMALL["all_global"]
        with tempfile.TemporaryDirectory() as d:
            m = make_sam(d, vision, max_shard_size="300KB")
            self.assertFalse(os.path.exists(os.path.join(d, "model.safetensors")))
            index = os.path.join(d, "model.safetensors.index.json")
            self.assertTrue(os.path.exists(index))
            px = torch.randn(1, 3, 96, 96, generator=torch.Generator().manual_seed(4))
            with torch.no_grad():
                ref = m.get_image_embeddings(px)[0].numpy()
            for path in (d, os.path.join(d, "config.json"), index):
                p = vitc.SamPredictor(vitc.Sam(path))
                p.set_image_tensor(px[0].numpy(), (96, 96))
                self.assertLess(rel_err(p.embedding, ref), TOL, path)

    def test_photo_preprocessing_matches_sam_processor(self):
        """set_image on a photo: SamProcessor's resize (PIL bilinear), rescale,
        normalize and padding, at a small model's input size."""
        vision = SMALL["padded_windows"]
        S = vision["image_size"]
        proc = SamImageProcessorPil(size={"longest_edge": S}, pad_size={"height": S, "width": S})
        with tempfile.TemporaryDirectory() as d:
            m = make_sam(d, vision)
            p = vitc.SamPredictor(vitc.Sam(d))
            for photo in ("coffee.png", "astronaut.png"):
                with self.subTest(photo=photo):
                    path = os.path.join(PHOTOS, photo)
                    img = Image.open(path).convert("RGB")
                    px = proc(img, return_tensors="pt")["pixel_values"]
                    with torch.no_grad():
                        ref = m.get_image_embeddings(px)[0].numpy()
                    p.set_image(path)
                    self.assertEqual(p.original_size, (img.height, img.width))
                    self.assertLess(rel_err(p.embedding, ref), TOL)
                    p.set_image(np.asarray(img))  # the array path: the same numbers
                    self.assertLess(rel_err(p.embedding, ref), TOL)

    def test_bad_models_are_one_line_errors(self):
        vision = SMALL["padded_windows"]
        with tempfile.TemporaryDirectory() as d:
            make_sam(d, vision)
            wpath = os.path.join(d, "model.safetensors")
            sd = load_file(wpath)
            cfg_path = os.path.join(d, "config.json")
            with open(cfg_path) as f:
                cfg = json.load(f)

            def expect(fragment, weights=None, config=None):
                save_file(weights if weights is not None else sd, wpath)
                with open(cfg_path, "w") as f:
                    json.dump(config if config is not None else cfg, f)
                with self.assertRaises(vitc.VitcError) as cm:
                    vitc.Sam(d)
                self.assertIn(fragment, first_line_only(self, cm.exception))

            name = "vision_encoder.layers.1.attn.rel_pos_h"
            expect("missing tensor " + name, weights={k: v for k, v in sd.items() if k != name})
            # a windowed block's table at the global size
            wrong = dict(sd)
            wrong["vision_encoder.layers.0.attn.rel_pos_h"] = torch.zeros(19, 24)
            expect("tensor vision_encoder.layers.0.attn.rel_pos_h: expected [7, 24]", weights=wrong)
            wrong = dict(sd)
            wrong["vision_encoder.neck.conv2.weight"] = torch.zeros(32, 32, 1, 1)
            expect("vision_encoder.neck.conv2.weight", weights=wrong)
            # what SAM cannot run (a window that does not divide the grid it can:
            # it pads, as the small configs above check)
            bad = json.loads(json.dumps(cfg))
            bad["vision_config"]["num_attention_heads"] = 5
            expect("not a multiple of num_attention_heads", config=bad)
            bad = json.loads(json.dumps(cfg))
            bad["vision_config"]["hidden_act"] = "swish"
            expect("hidden_act", config=bad)
            bad = json.loads(json.dumps(cfg))
            bad["vision_config"]["window_size"] = -3
            expect("window_size", config=bad)
            bad = json.loads(json.dumps(cfg))
            bad["vision_config"]["patch_size"] = 400
            expect("patch_size", config=bad)
            bad = json.loads(json.dumps(cfg))
            bad["model_type"] = "vit"
            expect("not a Segment Anything model", config=bad)
            # and the classifier loader points at the SAM one
            save_file(sd, wpath)
            with open(cfg_path, "w") as f:
                json.dump(cfg, f)
            with self.assertRaises(vitc.VitcError) as cm:
                vitc.load_model(d)
            self.assertIn("vitc_sam_load", first_line_only(self, cm.exception))
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.Sam(os.path.join(d, "gone"))
        first_line_only(self, cm.exception)

    def test_bad_images_are_one_line_errors(self):
        with tempfile.TemporaryDirectory() as d:
            make_sam(d, SMALL["all_global"])
            p = vitc.SamPredictor(vitc.Sam(d))
            with self.assertRaises(vitc.VitcError) as cm:  # resizes to 0 x 96
                p.set_image(np.zeros((1, 400, 3), np.uint8))
            self.assertIn("too elongated", first_line_only(self, cm.exception))
            with self.assertRaises(ValueError):
                p.set_image_tensor(np.zeros((3, 8, 8), np.float32), (8, 8))
            with self.assertRaises(RuntimeError):  # no image yet
                p.embedding
            p.set_image(np.full((1, 1, 3), 200, np.uint8))  # 1 x 1: upscaled, allowed
            self.assertEqual(p.embedding.shape, (32, 6, 6))
            self.assertTrue(np.isfinite(p.embedding).all())


@unittest.skipIf(torch is None, "needs torch, transformers, PIL, safetensors and scikit-image")
@unittest.skipIf(NO_DECODER, "SAM's mask decoder is not in this build: vitc_sam_load refuses")
class TestSamPredictor(unittest.TestCase):
    """vitc.SamPredictor.predict (the binding over vitc_sam_predict) against
    SamProcessor + SamModel + post_process_masks on a photo: every weight
    drawn (the default init zeroes biases and keeps LayerNorms at identity)."""

    S = 160
    C = 32  # the decoder's width

    @classmethod
    def setUpClass(cls):
        S, C = cls.S, cls.C
        cfg = SamConfig(
            vision_config=dict(SMALL["padded_windows"], output_channels=C, num_pos_feats=C // 2),
            prompt_encoder_config=dict(hidden_size=C, image_size=S, patch_size=16,
                                       mask_input_channels=8),
            mask_decoder_config=dict(hidden_size=C, mlp_dim=64, num_attention_heads=2,
                                     iou_head_hidden_dim=24))
        torch.manual_seed(0)
        cls.model = SamModel(cfg).eval()
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
        cls.proc = SamProcessor(image_processor=SamImageProcessorPil(
            size={"longest_edge": S}, pad_size={"height": S, "width": S}))
        cls.path = os.path.join(PHOTOS, "coffee.png")
        cls.img = Image.open(cls.path).convert("RGB")
        cls.pred = vitc.SamPredictor(vitc.Sam(cls.dir.name))
        cls.pred.set_image(cls.path)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def reference(self, multimask, points=None, labels=None, box=None, mask=None):
        kw = {}
        if points is not None:
            kw.update(input_points=[[points]], input_labels=[[labels]])
        if box is not None:
            kw.update(input_boxes=[[box]])
        inp = self.proc(images=self.img, return_tensors="pt", **kw)
        if mask is not None:
            inp["input_masks"] = torch.from_numpy(mask)[None, None]
        with torch.no_grad():
            out = self.model(**inp, multimask_output=multimask)
        masks = self.proc.image_processor.post_process_masks(
            out.pred_masks, inp["original_sizes"], inp["reshaped_input_sizes"], binarize=False)
        return masks[0][0].numpy(), out.iou_scores[0, 0].numpy(), out.pred_masks[0, 0].numpy()

    def check(self, got, ref):
        masks, iou, low = got
        rmasks, riou, rlow = ref
        self.assertEqual(masks.shape, rmasks.shape)
        self.assertEqual(masks.shape[1:], (self.img.height, self.img.width))
        self.assertLess(rel_err(masks, rmasks), 1e-4)
        self.assertLess(rel_err(low, rlow), 1e-4)
        np.testing.assert_allclose(iou, riou, rtol=1e-4, atol=1e-5)

    def test_points_and_box_multimask(self):
        pts, labs, box = [[300.0, 200.0], [100.0, 350.0]], [1, 0], [50.0, 60.0, 500.0, 380.0]
        got = self.pred.predict(points=pts, labels=labs, box=box, return_logits=True)
        self.assertEqual(got[0].shape[0], 3)
        self.check(got, self.reference(True, pts, labs, box))
        # the masks thresholded in C (vitc_sam_prompt.binary): the logits'
        # signs, every pixel of the three masks; the arrays own C's buffers
        binary, iou, low = self.pred.predict(points=pts, labels=labs, box=box)
        self.assertEqual(binary.dtype, np.bool_)
        np.testing.assert_array_equal(binary, got[0] > 0)
        np.testing.assert_array_equal(low, got[2])
        np.testing.assert_array_equal(iou, got[1])
        view = binary[1:, ::2]
        del binary
        self.assertEqual(int(view.sum()), int((got[0][1:, ::2] > 0).sum()))

    def test_one_point_multimask_and_single(self):
        for multimask in (True, False):
            with self.subTest(multimask=multimask):
                got = self.pred.predict(points=[[410.0, 260.0]], labels=[1],
                                        multimask_output=multimask, return_logits=True)
                self.check(got, self.reference(multimask, [[410.0, 260.0]], [1]))

    def test_mask_prompt_single_mask_and_threshold(self):
        _, _, low = self.pred.predict(points=[[300.0, 200.0]], labels=[1])
        got = self.pred.predict(points=[[420.0, 120.0]], labels=[1], mask_input=low[0],
                                multimask_output=False, return_logits=True)
        ref = self.reference(False, [[420.0, 120.0]], [1], mask=low[0])
        self.check(got, ref)
        binary, _, _ = self.pred.predict(points=[[420.0, 120.0]], labels=[1], mask_input=low[0],
                                         multimask_output=False)
        self.assertEqual(binary.dtype, np.bool_)
        np.testing.assert_array_equal(binary, got[0] > 0)

    def test_bad_prompts(self):
        with self.assertRaises(ValueError):
            self.pred.predict(points=[[1.0, 2.0]], labels=[1, 1])
        with self.assertRaises(ValueError):
            self.pred.predict(box=[1.0, 2.0, 3.0])
        with self.assertRaises(ValueError):
            self.pred.predict(points=[[1.0, 2.0]], labels=[1], mask_input=np.zeros((8, 8)))


class TestSamPredictorWide(TestSamPredictor):
    """The same at a decoder width of 64, where a few tokens' prompt takes
    the upscaling's folded first product (its columns L H T + 2 L, fewer
    than the width: 32 for one point, 40 for two points and a box)."""
    C = 64


@unittest.skipIf(torch is None or sam_model_registry is None,
                 "needs torch, transformers, PIL, scikit-image and segment-anything")
@unittest.skipIf(NO_DECODER, "SAM's mask decoder is not in this build: vitc_sam_load refuses")
class TestSamViTB(unittest.TestCase):
    def test_converted_vit_b_on_a_photo(self):
        """sam_vit_b's original layout -> tools/convert_sam.py -> vitc, on
        astronaut.png through set_image, against the original image_encoder
        on SamProcessor's pixels; the converted directory is what
        transformers loads too, with the released (SamConfig()) structure."""
        torch.manual_seed(0)
        orig = sam_model_registry["vit_b"]().eval()
        perturb_positions(orig, 0.2)
        with tempfile.TemporaryDirectory() as d:
            src, out = os.path.join(d, "sam_vit_b.pth"), os.path.join(d, "sam-vit-b")
            torch.save(orig.state_dict(), src)
            r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "convert_sam.py"),
                                src, out], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            os.remove(src)
            with open(os.path.join(out, "config.json")) as f:
                vision = json.load(f)["vision_config"]
            released = SamConfig().vision_config
            for k, v in vision.items():
                want = getattr(released, k)
                self.assertEqual(list(want) if isinstance(want, tuple) else want, v, k)
            _, info = SamModel.from_pretrained(out, output_loading_info=True)
            self.assertEqual({k: v for k, v in info.items() if v}, {})

            path = os.path.join(PHOTOS, "astronaut.png")
            px = SamImageProcessorPil()(Image.open(path).convert("RGB"),
                                        return_tensors="pt")["pixel_values"]
            with torch.no_grad():
                ref = orig.image_encoder(px)[0].numpy()
            del orig
            p = vitc.SamPredictor(vitc.Sam(out))
            p.set_image(path)
            self.assertEqual(p.embedding.shape, (256, 64, 64))
            self.assertLess(rel_err(p.embedding, ref), TOL)


if __name__ == "__main__":
    unittest.main()
