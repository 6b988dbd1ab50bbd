"""vitc_vit_load_precision through the binding (from_safetensors /
load_model with precision=): the same logits, bit for bit, as loading in
fp32 and then setting the precision — safetensors files in F32, F16 and
BF16, sharded Hub DINOv2 and CLIP directories — and a load peak that
shows the weights were packed while read: a subprocess loading a ~57 MB
model in int8 grows its peak resident memory (VmHWM) by well under an fp32
load's growth (issue 11: bf16 / int8 models below fp32's at load too).

Needs torch and torchvision (the .venv that scripts/install-deps.sh makes); skipped without.
"""
import os
import subprocess
import sys
import unittest

import numpy as np

import vitc

try:
    from .util import ROOT, TmpDirCase, random_images, reference_modules, torch
except ImportError:  # run as a script
    from util import ROOT, TmpDirCase, random_images, reference_modules, torch
try:
    from torchvision.models.vision_transformer import VisionTransformer as TVViT
except ImportError:  # pragma: no cover
    torch = None
hf_ref, gen_vit = reference_modules("hf_ref", "gen_vit")

EXPORT = os.path.join(ROOT, "tools", "export_safetensors.py")
PRECISIONS = ("fp32", "bf16", "int8")

# The child: VmRSS before the load, VmHWM after (the peak reset first where
# the kernel allows, so only the load's own peak counts).
PROBE = r"""
import sys
sys.path.insert(0, sys.argv[1])
import vitc
def kb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
before = kb("VmRSS")
m = vitc.VisionTransformer.from_safetensors(sys.argv[2], precision=sys.argv[3])
print(kb("VmHWM") - before, kb("VmRSS") - before)
"""


@unittest.skipIf(torch is None, "needs torch and torchvision")
class TestLoadPrecision(TmpDirCase):
    TMP_PREFIX = "vitc_loadprec_"

    def export(self, model, name, dtype="f32", heads=4):
        pth = os.path.join(self.tmp, name + ".pth")
        out = os.path.join(self.tmp, name + ".safetensors")
        torch.save(model.state_dict(), pth)
        r = subprocess.run([sys.executable, EXPORT, pth, out, "--num-heads", str(heads),
                            "--dtype", dtype], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return out

    def same(self, load, x, call):
        """load(precision) against load("fp32") then .precision = p."""
        for p in PRECISIONS:
            a = load(p)
            b = load("fp32")
            b.precision = p
            self.assertEqual(a.precision, p)
            np.testing.assert_array_equal(call(a, x), call(b, x), err_msg=p)

    def test_safetensors_dtypes(self):
        torch.manual_seed(0)
        cfg = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64,
                   mlp_dim=160, num_classes=30)
        model = gen_vit.reinit_head(gen_vit.randomize(TVViT(**cfg), 3), 4).eval()
        x = np.random.default_rng(1).standard_normal((3, 3, 32, 32)).astype(np.float32)
        for dt in ("f32", "f16", "bf16"):
            path = self.export(model, "m_" + dt, dt)
            self.same(lambda p: vitc.VisionTransformer.from_safetensors(path, precision=p), x,
                      lambda m, x: m(x))

    def test_hub_dinov2_sharded_and_clip(self):
        gen = torch.Generator().manual_seed(2)
        cfg = hf_ref.dinov2_config(None)
        sd = hf_ref.random_state(cfg, 5)
        d = os.path.join(self.tmp, "dinov2")
        hf_ref.save_hub(d, hf_ref.round_bf16(sd), cfg, dtype="BF16", shards=2)
        x = random_images(gen, [(42, 42)])[(42, 42)].numpy()
        self.same(lambda p: vitc.load_model(d, precision=p), x, lambda m, x: m.embed(x))
        ccfg = hf_ref.clip_config("clip_vision_model")
        csd, ints = hf_ref.clip_random_state(ccfg, 6)
        c = os.path.join(self.tmp, "clip")
        hf_ref.save_clip(c, csd, ints, ccfg)
        x = random_images(gen, [(32, 32)])[(32, 32)].numpy()
        self.same(lambda p: vitc.load_model(c, precision=p), x, lambda m, x: m.embed(x))

    def test_bad_precision(self):
        with self.assertRaises(ValueError):
            vitc.VisionTransformer.from_safetensors("nonexistent.safetensors", precision="fp16")
        with self.assertRaises(TypeError):
            vitc.load_model("nonexistent", precision=8)

    def test_load_peak(self):
        # ~57 MB of fp32 weights (8 blocks of width 384), random: only the
        # sizes matter. Written here, so that the children only load it.
        path = os.path.join(self.tmp, "medium.safetensors")
        vitc.VisionTransformer(image_size=64, patch_size=16, num_layers=8, num_heads=6,
                               hidden_dim=384, mlp_dim=1536, num_classes=10,
                               seed=3).save(path)
        self.assertGreater(os.path.getsize(path), 40 << 20)
        growth = {}
        for p in PRECISIONS:
            r = subprocess.run([sys.executable, "-c", PROBE, os.path.join(ROOT, "python"),
                                path, p], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            growth[p] = [int(v) for v in r.stdout.split()]
        size_kb = os.path.getsize(path) / 1024
        msg = "load peak growth (kB, [VmHWM, VmRSS]) %r, file %.0f kB" % (growth, size_kb)
        print("#", msg)
        self.assertGreater(growth["fp32"][0], 0.9 * size_kb, msg)  # the fp32 model is resident
        self.assertLess(growth["int8"][0], 0.6 * growth["fp32"][0], msg)
        self.assertLess(growth["bf16"][0], 0.8 * growth["fp32"][0], msg)


if __name__ == "__main__":
    unittest.main()
