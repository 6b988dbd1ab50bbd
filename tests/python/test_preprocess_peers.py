"""Preprocessing against transformers' own image processors (issue 19,
deliverable 3): for ViT, DeiT, DINOv2 (BiT), CLIP and SigLIP, a tiny model
of the family saved with transformers' save_pretrained next to the
processor's save_pretrained (so preprocessor_config.json is what
transformers writes, at the family's real settings), then vitc's
m.preprocess(path) against processor(images=Image.open(path)) on
scikit-image's photos: RGB of several sizes and aspect ratios, JPEG,
grayscale, and alpha (RGBA, gray+alpha, a palette with a transparent entry).

transformers 5 has two backends per processor: "pil" (the old slow path:
PIL resize in uint8, numpy after it) and "torchvision" (the default, the
old fast path). vitc must equal the PIL backend bit for bit (float32 arrays
equal) and stay within one uint8 step (1/255/std per channel) of the
torchvision one, whose bicubic/bilinear differs from PIL's by a level here
and there (under 1% of the values), two where it enlarges an image with
sharp edges (page.png, 191 rows made 256 or 224, bicubic).

Where a processor has no do_convert_rgb (ViT, DeiT), transformers refuses
gray and RGBA images, so the reference is what its users do,
Image.open(path).convert("RGB"); where it has (CLIP, SigLIP, BiT) the image
goes in as opened and transformers composites alpha over white.

Needs transformers, torch, PIL and scikit-image; skipped without.
"""
import json
import os
import shutil
import unittest

import numpy as np

import vitc

try:
    from .util import DATA, VITC, TmpDirCase, assert_close, run_vitc as run
except ImportError:  # run as a script
    from util import DATA, VITC, TmpDirCase, assert_close, run_vitc as run

try:
    import skimage
    import transformers as T
    from PIL import Image
    from transformers import AutoImageProcessor
    SKIMAGE = os.path.join(os.path.dirname(os.path.abspath(skimage.__file__)), "data")
    T.logging.set_verbosity_error()
    T.logging.disable_progress_bar()
except ImportError:  # pragma: no cover
    T = None

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
# Different sizes and aspect ratios (square, 3:2 both ways round, a wide
# page that DINOv2 and SigLIP enlarge), two JPEGs, three gray images, an
# RGBA one whose alpha is almost all opaque.
PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "motorcycle_left.png", "rocket.jpg",
          "retina.jpg", "camera.png", "page.png", "coins.png", "horse.png"]
# The torchvision backend against PIL's: uint8 levels (see the docstring).
FAST_STEPS, FAST_STEPS_ENLARGED = 1, 2
ENLARGED = "page.png"


def tiny_model(kind):
    """A one-layer model of the family at its real input size."""
    kw = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    if kind == "vit":
        return T.ViTModel(T.ViTConfig(image_size=224, patch_size=16, **kw))
    if kind == "deit":
        return T.DeiTModel(T.DeiTConfig(image_size=224, patch_size=16, **kw))
    if kind == "dinov2":
        return T.Dinov2Model(T.Dinov2Config(image_size=224, patch_size=14, **kw))
    if kind == "clip":
        return T.CLIPVisionModel(T.CLIPVisionConfig(image_size=224, patch_size=32, **kw))
    return T.SiglipVisionModel(T.SiglipVisionConfig(image_size=224, patch_size=16, **kw))


def processor(kind, **kw):
    """The family's processor as its Hub checkpoints have it
    (google/vit-base-patch16-224, facebook/deit-base-patch16-224,
    facebook/dinov2-base, openai/clip-vit-base-patch32,
    google/siglip-base-patch16-224), kw over that."""
    if kind == "vit":
        return T.ViTImageProcessor(**kw)
    if kind == "deit":
        return T.DeiTImageProcessor(**dict(dict(image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD),
                                           **kw))
    if kind == "dinov2":
        return T.BitImageProcessor(**dict(dict(size={"shortest_edge": 256},
                                               image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD),
                                          **kw))
    if kind == "clip":
        return T.CLIPImageProcessor(**kw)
    return T.SiglipImageProcessor(**kw)


@unittest.skipIf(T is None, "needs transformers, torch, PIL and scikit-image")
class TestPreprocessPeers(TmpDirCase):
    TMP_PREFIX = "vitc_pp_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.models = {}
        for kind in ("vit", "deit", "dinov2", "clip", "siglip"):
            d = os.path.join(cls.tmp, "model_" + kind)
            tiny_model(kind).save_pretrained(d)
            cls.models[kind] = d
        # Real photos given alpha: every alpha level over chelsea, a ramp
        # over camera (gray+alpha), coffee in 64 colours with one transparent.
        src = lambda n: Image.open(os.path.join(SKIMAGE, n))
        rgb = np.array(src("chelsea.png"))
        h, w = rgb.shape[:2]
        a = ((np.arange(w)[None, :] * 255 // (w - 1) + np.arange(h)[:, None] * 37) % 256)
        Image.fromarray(np.dstack([rgb, a.astype(np.uint8)]), "RGBA").save(cls.alpha_path("rgba"))
        cam = src("camera.png")
        ramp = Image.fromarray(np.tile(np.arange(512, dtype=np.uint16)[None] // 2, (512, 1))
                               .astype(np.uint8))
        Image.merge("LA", [cam, ramp]).save(cls.alpha_path("la"))
        pal = src("coffee.png").quantize(64)
        pal.save(cls.alpha_path("p"), transparency=int(np.bincount(np.array(pal).ravel()).argmax()))
        cls.photos = [os.path.join(SKIMAGE, n) for n in PHOTOS] + \
            [cls.alpha_path(k) for k in ("rgba", "la", "p")]

    @classmethod
    def alpha_path(cls, kind):
        return os.path.join(cls.tmp, "alpha_%s.png" % kind)

    def hub_dir(self, kind, name=None, pp=None, **kw):
        """The family's model with the processor's save_pretrained (or, with
        pp, that preprocessor_config.json as written by hand, as the Hub's
        older checkpoints have it)."""
        if name is None:
            name = kind
        d = self.path(name)
        if not os.path.isdir(d):
            shutil.copytree(self.models[kind], d)
            if pp is None:
                processor(kind, **kw).save_pretrained(d)
            else:
                with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
                    json.dump(pp, f)
        return d

    def reference(self, proc, path):
        """proc's pixel_values for the file, opened as its users open it."""
        img = Image.open(path)
        if img.mode != "RGB" and not proc.do_convert_rgb:
            img = img.convert("RGB")
        return proc(images=img, return_tensors="np")["pixel_values"][0]

    def check(self, d, photos=None, fast=True):
        """vitc equals the PIL backend exactly and the torchvision one within
        FAST_STEPS; returns the largest step seen against the latter."""
        m = vitc.load_model(d)
        slow = AutoImageProcessor.from_pretrained(d, backend="pil")
        self.assertEqual(slow.backend, "pil")
        quick = AutoImageProcessor.from_pretrained(d) if fast else None
        step = 1.0 / 255.0 / np.asarray(slow.image_std, np.float64).reshape(-1, 1, 1)
        worst = 0.0
        for path in photos or self.photos:
            what = "%s %s" % (os.path.basename(d), os.path.basename(path))
            got = m.preprocess(path)
            ref = self.reference(slow, path)
            self.assertEqual(ref.dtype, np.float32, what)
            self.assertEqual(got.shape, ref.shape, what)
            if not np.array_equal(got, ref):
                bad = got != ref
                self.fail("%s: %d of %d values differ from transformers' PIL backend, by up to "
                          "%g" % (what, bad.sum(), bad.size, np.abs(got - ref).max()))
            if quick is not None:
                self.assertEqual(quick.backend, "torchvision")
                q = self.reference(quick, path)
                levels = (np.abs(got.astype(np.float64) - q) / step).max()
                bound = FAST_STEPS_ENLARGED if os.path.basename(path) == ENLARGED else FAST_STEPS
                self.assertLess(levels, bound + 1e-3, what + " vs the torchvision backend")
                worst = max(worst, levels)
        return worst

    # ---- each family as its checkpoints are ----------------------------

    def test_vit(self):
        self.check(self.hub_dir("vit"))

    def test_deit(self):
        self.check(self.hub_dir("deit"))

    def test_dinov2_bit(self):
        self.check(self.hub_dir("dinov2"))

    def test_clip(self):
        self.check(self.hub_dir("clip"))

    def test_siglip(self):
        self.check(self.hub_dir("siglip"))

    def test_fast_backend_differs(self):
        """The torchvision backend is not PIL's: the bound above is needed,
        and one level is reached (so the exact check is not vacuous)."""
        d = self.hub_dir("clip")
        worst = self.check(d, photos=[os.path.join(SKIMAGE, "chelsea.png")])
        self.assertGreater(worst, 0.999)

    # ---- settings real checkpoints have --------------------------------

    def test_legacy_integer_sizes(self):
        """Older checkpoints' feature-extractor configs: integer size and
        crop_size. transformers 5 reads an integer size as a square where
        the class has default_to_square (ViT, DeiT) and as the shortest edge
        where not (CLIP, BiT, SigLIP: SigLIP then keeps the aspect ratio)."""
        common = {"do_normalize": True, "do_resize": True}
        cases = [
            ("vit", {"feature_extractor_type": "ViTFeatureExtractor", "size": 224,
                     "resample": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}),
            ("deit", {"feature_extractor_type": "DeiTFeatureExtractor", "size": 256,
                      "crop_size": 224, "do_center_crop": True, "resample": 3,
                      "image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD}),
            ("clip", {"feature_extractor_type": "CLIPFeatureExtractor", "size": 224,
                      "crop_size": 224, "do_center_crop": True, "resample": 3,
                      "image_mean": [0.48145466, 0.4578275, 0.40821073],
                      "image_std": [0.26862954, 0.26130258, 0.27577711]}),
            ("siglip", {"image_processor_type": "SiglipImageProcessor", "size": 224,
                        "resample": 3}),
        ]
        photos = [os.path.join(SKIMAGE, n) for n in ("chelsea.png", "rocket.jpg", "page.png")]
        for kind, pp in cases:
            d = self.hub_dir(kind, kind + "_legacy", pp=dict(common, **pp))
            self.check(d, photos)
        m = vitc.load_model(self.path("siglip_legacy"))
        self.assertEqual(m.preprocess(photos[0]).shape, (3, 224, 336))

    def test_non_default_settings(self):
        """No crop (CLIP, non-square output), height != width and bicubic
        for ViT, bilinear for BiT, a crop asked of ViT (transformers 5 crops
        with any processor), default_to_square in the file."""
        photos = [os.path.join(SKIMAGE, n) for n in ("coffee.png", "camera.png")] + \
            [self.alpha_path("rgba")]
        self.check(self.hub_dir("clip", "clip_nocrop", do_center_crop=False), photos)
        self.check(self.hub_dir("vit", "vit_hw", size={"height": 160, "width": 240}, resample=3),
                   photos)
        self.check(self.hub_dir("dinov2", "dinov2_bilinear", resample=2), photos)
        self.check(self.hub_dir("vit", "vit_crop", do_center_crop=True,
                                crop_size={"height": 200, "width": 180}), photos)
        self.check(self.hub_dir("deit", "deit_int_shortest", pp={
            "size": 256, "default_to_square": False, "crop_size": 224, "do_center_crop": True,
            "resample": 3, "image_processor_type": "DeiTImageProcessor"}), photos)

    def test_do_convert_rgb(self):
        """do_convert_rgb in the file wins over the class: a ViT that asks
        composites alpha over white, a CLIP that declines drops it (its
        users then convert("RGB"))."""
        rgba = [self.alpha_path("rgba"), self.alpha_path("la"), self.alpha_path("p")]
        d = self.hub_dir("vit", "vit_convert", do_convert_rgb=True)
        self.check(d, rgba)
        self.assertEqual(vitc.load_model(d).preprocess(rgba[0]).shape, (3, 224, 224))
        self.check(self.hub_dir("clip", "clip_noconvert", do_convert_rgb=False), rgba)
        # The two really differ on these images.
        a = vitc.load_model(self.hub_dir("clip")).preprocess(rgba[0])
        b = vitc.load_model(self.path("clip_noconvert")).preprocess(rgba[0])
        self.assertGreater(np.abs(a - b).max(), 1.0)

    def test_every_alpha_level(self):
        """PIL's alpha_composite over white for every (value, alpha) pair,
        unresized and uncropped so the composite itself is compared."""
        v, a = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
        img = np.dstack([v, 255 - v, (v * 7) % 256, a]).astype(np.uint8)
        path = self.path("levels.png")
        Image.fromarray(img, "RGBA").save(path)
        d = self.hub_dir("siglip", "siglip_levels", do_resize=False)
        self.check(d, [path], fast=False)

    def test_every_decoder_kind(self):
        """tests/data's small images of every PNG and JPEG kind (bit depths,
        palettes and colour keys with transparency, interlaced, 16-bit RGB(A),
        progressive and 4:4:4 JPEG), unresized, through a processor that
        composites alpha and one that drops it. 16-bit gray is left out: PIL
        clips it to 255 on convert("RGB"), vitc keeps the high byte."""
        with open(os.path.join(DATA, "images.txt")) as f:
            names = [ln.split()[0] for ln in f if ln.strip() and not ln.startswith("#")]
        photos = [os.path.join(DATA, n) for n in names if n != "gray16.png"]
        self.assertGreater(len(photos), 15)
        self.check(self.hub_dir("clip", "clip_kinds", do_resize=False, do_center_crop=False),
                   photos, fast=False)
        self.check(self.hub_dir("vit", "vit_kinds", do_resize=False), photos, fast=False)

    def test_crop_larger_than_image(self):
        """transformers pads with zeros where the crop is larger than the
        (resized) image, the image ceil((crop - size) / 2) from the top left:
        on both axes, and on one with the other cropped."""
        photos = [os.path.join(SKIMAGE, n) for n in ("microaneurysms.png", "coins.png")]
        d = self.hub_dir("clip", "clip_pad", do_resize=False,
                         crop_size={"height": 320, "width": 320})
        self.check(d, photos, fast=False)
        self.check(self.hub_dir("dinov2", "dinov2_pad", size={"shortest_edge": 200}), photos,
                   fast=False)

    @unittest.skipIf(not os.path.exists(VITC), "needs build/vitc")
    def test_cli_embed_composites_alpha(self):
        """`vitc embed` decodes as the processor converts: its embedding is
        the model's on transformers' pixel_values of an RGBA photo."""
        d = self.hub_dir("clip")
        path = self.alpha_path("rgba")
        x = self.reference(AutoImageProcessor.from_pretrained(d, backend="pil"), path)
        rc, out, err = run("embed", "--model", d, "--json", path)
        self.assertEqual(rc, 0, err)
        ref = vitc.load_model(d).embed(x[None])
        assert_close(self, json.loads(out)["embedding"], ref[0], "vitc embed of an RGBA photo")


if __name__ == "__main__":
    unittest.main()
