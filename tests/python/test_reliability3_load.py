"""Reliability, third round (part B): regressions for the loading side. Each
test fails on the code before its fix.

M3  Hub JSON files are bounded by kind (bytes and values) before jansson
    builds a tree; plot-log lines likewise.
M4  the Hub loader checks the file's tensors against the config before it
    allocates the model.
L9  a vitc checkpoint saved inside a Hub directory is read as itself.
L11 an architecture name is cut at a UTF-8 character boundary.
L12 shards are opened one at a time (1,100 shards under `ulimit -n 1024`).
L13 int8 refuses a non-finite weight, naming it.
Also: a one-value image_mean / image_std is broadcast as transformers does;
vitc_vit_preprocess makes in_channels planes (a gray model gets one).
"""
import json
import os
import resource
import subprocess
import sys
import unittest

import numpy as np

import vitc

try:
    from .util import DATA, VITC, TmpDirCase, run_vitc as run
except ImportError:  # run as a script
    from util import DATA, VITC, TmpDirCase, run_vitc as run

try:
    import torch
    import transformers as T
    from PIL import Image
    T.logging.set_verbosity_error()
    T.logging.disable_progress_bar()
except ImportError:  # pragma: no cover
    T = None

HAVE_VITC = os.path.exists(VITC)
TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
PHOTO = os.path.join(DATA, "photo.png")

# Load a model in a child process: prints OK family arch, or the error.
LOAD = ("import sys, vitc\n"
        "try:\n"
        "    m = vitc.load_model(sys.argv[1], precision=sys.argv[2])\n"
        "    print('OK', m.config['family'], m.config['arch'])\n"
        "except Exception as e:\n"
        "    print('ERR', e)\n")


def run_child(args, mib=None, nofile=None, timeout=120):
    """args in a child with an address-space and/or descriptor limit."""
    def limit():
        if mib:
            resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    p = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, preexec_fn=limit)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def load_child(path, precision="fp32", **kw):
    rc, out, err = run_child([sys.executable, "-c", LOAD, path, precision], **kw)
    return (out.strip() or err.strip()), rc


def edit_json(path, fn):
    with open(path) as f:
        o = json.load(f)
    fn(o)
    with open(path, "w") as f:
        json.dump(o, f)


@unittest.skipIf(T is None or not HAVE_VITC, "needs transformers, torch and build/vitc")
class TestHubLoading(TmpDirCase):
    TMP_PREFIX = "vitc_r3load_"

    def hub_vit(self, name, head=False, **cfg):
        torch.manual_seed(0)
        kw = dict(TINY, image_size=32, patch_size=8)
        kw.update(cfg)
        c = T.ViTConfig(**kw)
        m = (T.ViTForImageClassification if head else T.ViTModel)(c).eval()
        d = self.path(name)
        m.save_pretrained(d)
        T.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(d)
        return d, m

    # -- M3 ---------------------------------------------------------------
    def test_config_json_bounded(self):
        """A config.json of 4 MB of small values (a 320 MB jansson tree, 4.8 GB
        at 60 MB) and one of 9 MB are refused before parsing, naming the
        bound; before, both were parsed whole (64 MiB allowed)."""
        d, _ = self.hub_vit("big_cfg")
        edit_json(os.path.join(d, "config.json"), lambda o: o.update(pad=[0] * 2000000))
        msg, _ = load_child(d)
        self.assertIn("over the limit of 262144 for a Hub config.json", msg)
        edit_json(os.path.join(d, "config.json"), lambda o: o.update(pad="x" * (9 << 20)))
        msg, _ = load_child(d)
        self.assertIn("bytes are over the limit of 8388608 bytes for a Hub config.json", msg)

    def test_preprocessor_config_bounded(self):
        d, _ = self.hub_vit("big_pp")
        edit_json(os.path.join(d, "preprocessor_config.json"),
                  lambda o: o.update(pad="x" * (2 << 20)))
        msg, _ = load_child(d)
        self.assertIn("over the limit of 1048576 bytes for a Hub preprocessor_config.json", msg)

    def test_real_21k_label_config_loads(self):
        """The bound is set from real files: ImageNet-22k's 21,843 labels in
        id2label and label2id (1.3 MB) load."""
        labels = {i: "n%08d label number %d, a synonym" % (i, i) for i in range(21843)}
        d, _ = self.hub_vit("in22k", head=True, num_labels=21843, id2label=labels,
                            label2id={v: k for k, v in labels.items()})
        self.assertGreater(os.path.getsize(os.path.join(d, "config.json")), 1 << 20)
        m = vitc.load_model(d)
        self.assertEqual(m.config["num_classes"], 21843)
        self.assertEqual(m.labels[21842], labels[21842])

    def test_plot_log_long_line(self):
        """A 16 MB line of a --log file: parsed whole before (a jansson tree
        of ~700 MB, out of memory under 512 MiB, reported as "not training
        records"); now skipped unread, said so, and the plot is drawn."""
        log = self.path("train.jsonl")
        with open(log, "w") as f:
            f.write('{"type": "step", "epoch": 1, "step": 1, "loss": 2.0}\n')
            f.write("[" + "0," * (8 << 20) + "0]\n")
            f.write('{"type": "epoch", "epoch": 1, "step": 1, "train_loss": 1.5, '
                    '"train_acc": 0.5}\n')
        out = self.path("curves.png")
        rc, _, err = run_child([VITC, "plot-log", log, "--out", out], mib=512)
        self.assertEqual(rc, 0, err)
        self.assertIn("1 lines over 65536 bytes skipped", err)
        self.assertTrue(os.path.exists(out))

    def test_similar_cache_names_bounded(self):
        """A cache whose names are 24 MB of empty lists (the key and the
        embeddings intact): parsed whole before (a jansson tree of about
        900 MB); now refused unparsed as stale, and rebuilt. The child's
        peak memory says which."""
        from safetensors import safe_open
        from safetensors.numpy import save_file
        import glob
        import shutil
        model = self.path("sim.safetensors")
        vitc.Model(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=32,
                   mlp_dim=64, num_classes=3).save(model)
        index = self.path("sim_images")
        os.makedirs(index)
        for n in ("photo.png", "rgb8.png", "photo.jpg"):
            shutil.copy(os.path.join(DATA, n), index)
        env = dict(os.environ, XDG_CACHE_HOME=self.path("sim_xdg"))
        cmd = [VITC, "similar", "--model", model, "--index", index, "--json", "--quiet", PHOTO]
        ref = subprocess.run(cmd, capture_output=True, env=env, check=True).stdout
        cache, = glob.glob(os.path.join(self.path("sim_xdg"), "vitc", "similar", "*.safetensors"))
        with safe_open(cache, "np") as f:
            meta = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta["vitc.similar.names"] = "[" + "[]," * (8 << 20) + "[]]"
        save_file(tensors, cache, metadata=meta)
        peak = ("import resource, subprocess, sys\n"
                "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
                "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
                "sys.stdout.flush(); sys.stdout.buffer.write(p.stdout)\n")
        out = subprocess.run([sys.executable, "-c", peak] + cmd, capture_output=True, env=env,
                             check=True).stdout
        head, _, rest = out.partition(b"\n")
        rc, kb = map(int, head.split())
        self.assertEqual((rc, rest), (0, ref))
        self.assertLess(kb, 400 << 10, "peak %d MB" % (kb >> 10))
        with safe_open(cache, "np") as f:  # rebuilt
            self.assertLess(len(f.metadata()["vitc.similar.names"]), 1000)

    # -- M4 ---------------------------------------------------------------
    def test_tensors_checked_before_allocation(self):
        """One layer of weights (1 MB) and num_hidden_layers 4096 in the
        config: 4 GB were allocated and touched before the missing layer 1
        was found; now the missing tensor is named, under 1.5 GiB."""
        d, _ = self.hub_vit("deep", intermediate_size=4096)
        edit_json(os.path.join(d, "config.json"), lambda o: o.update(num_hidden_layers=4096))
        msg, _ = load_child(d, mib=1536)
        self.assertIn("missing tensor encoder.layer.1.", msg)

    def test_text_tower_checked_before_allocation(self):
        """The text tower too: one text layer (10 MB) and its config saying
        4096 layers asked for 39 GB before the missing layer 1 was found
        ("cannot allocate the text tower's ... parameters" under the limit);
        now the missing tensor is named."""
        torch.manual_seed(0)
        c = T.CLIPConfig(
            text_config=dict(hidden_size=256, intermediate_size=4096, num_hidden_layers=1,
                             num_attention_heads=4, vocab_size=1000, max_position_embeddings=16),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, image_size=32, patch_size=16),
            projection_dim=32)
        d = self.path("clip_deep_text")
        T.CLIPModel(c).eval().save_pretrained(d)
        edit_json(os.path.join(d, "config.json"),
                  lambda o: o["text_config"].update(num_hidden_layers=4096))
        msg, _ = load_child(d, mib=1536)
        self.assertIn("missing tensor text_model.encoder.layers.1.", msg)

    # -- L9 ---------------------------------------------------------------
    def test_vitc_checkpoint_inside_hub_dir(self):
        """A model fine-tuned from a Hub directory and saved into it is read as
        the saved file, not as the directory's Hub model."""
        d, _ = self.hub_vit("ft", head=True, num_labels=4)
        m = vitc.load_model(d)
        m.reset_head(3, seed=5)
        path = os.path.join(d, "finetuned.safetensors")
        m.save(path)
        x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
        ref = m(x)
        got = vitc.load_model(path)
        self.assertEqual(got.config["num_classes"], 3)
        np.testing.assert_array_equal(got(x), ref)
        # the Hub model itself is still read from its own file in the directory
        self.assertEqual(vitc.load_model(os.path.join(d, "model.safetensors"))
                         .config["num_classes"], 4)

    # -- L11 --------------------------------------------------------------
    def test_arch_cut_at_character_boundary(self):
        """An architecture of 20 two-byte characters (40 bytes) was cut at 31
        bytes, inside the 16th: UnicodeDecodeError; now 15 whole characters."""
        d, _ = self.hub_vit("utf8")
        edit_json(os.path.join(d, "config.json"), lambda o: o.update(architectures=["Ä" * 20]))
        self.assertEqual(vitc.load_model(d).config["arch"], "Ä" * 15)

    # -- L12 --------------------------------------------------------------
    def test_shards_one_descriptor_at_a_time(self):
        """Over 100 shards under a limit of 64 descriptors (1,100 under
        1,024 the issue's case): every shard was held open, "Too many open
        files"; now one at a time, and the outputs equal transformers'."""
        d, ref = self.hub_vit("sharded", num_hidden_layers=16)
        import glob
        import shutil
        for f in glob.glob(os.path.join(d, "model*.safetensors*")):
            os.remove(f)
        ref.save_pretrained(d, max_shard_size="2KB")
        n = len(glob.glob(os.path.join(d, "model-*.safetensors")))
        self.assertGreater(n, 100)
        msg, rc = load_child(d, nofile=64)
        self.assertTrue(msg.startswith("OK"), msg)
        for prec in ("fp32", "int8"):
            msg, rc = load_child(d, prec, nofile=64)
            self.assertTrue(msg.startswith("OK"), prec + ": " + msg)
        x = np.random.default_rng(2).standard_normal((1, 3, 32, 32)).astype(np.float32)
        with torch.no_grad():
            want = ref(pixel_values=torch.from_numpy(x)).last_hidden_state[:, 0].numpy()
        got = vitc.load_model(d).forward_features(x)[:, 0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        shutil.rmtree(d)

    # -- L13 --------------------------------------------------------------
    def test_int8_refuses_non_finite(self):
        """A NaN (or an infinity) in a weight: fp32 gives NaN out, int8 gave
        plausible numbers; now int8 refuses it at pack time, naming it."""
        for bad in (float("nan"), float("inf")):
            d, ref = self.hub_vit("nan", head=True, num_labels=3)
            with torch.no_grad():
                dict(ref.named_parameters())["vit.layers.0.mlp.fc1.weight"][3, 5] = bad
            ref.save_pretrained(d)
            x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
            self.assertFalse(np.isfinite(vitc.load_model(d)(x)).all())
            with self.assertRaises(vitc.VitcError) as cm:
                vitc.load_model(d, precision="int8")
            msg = str(cm.exception)
            self.assertIn("int8", msg)
            self.assertIn("NaN" if bad != bad else "infinity", msg)
            self.assertIn("block 0", msg)
            self.assertIn("element %d" % (3 * 32 + 5), msg)
            # and switching a loaded model to int8 refuses it the same way
            m = vitc.load_model(d)
            with self.assertRaises(vitc.VitcError):
                m.precision = "int8"
                m(x)
        # the patch embedding runs in int8 too: its weight is checked the same way
        d, ref = self.hub_vit("nan_patch", head=True, num_labels=3)
        with torch.no_grad():
            ref.vit.embeddings.patch_embeddings.projection.weight[2, 1, 0, 3] = float("nan")
        ref.save_pretrained(d)
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.load_model(d, precision="int8")
        self.assertIn("the patch embedding", str(cm.exception))
        self.assertIn("NaN", str(cm.exception))

    # -- processor --------------------------------------------------------
    def test_one_value_mean_std_broadcast(self):
        """image_mean [0.25] / image_std [0.5]: refused before ("must be 3
        numbers"); transformers' default (torchvision) processor broadcasts a
        one-value list as it does a float, and so does vitc now: the output
        equals the float's, which equals transformers' PIL path."""
        d, _ = self.hub_vit("mean1")
        T.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=0.25,
                            image_std=0.5).save_pretrained(d)
        proc = T.AutoImageProcessor.from_pretrained(d, backend="pil")
        want = proc(images=Image.open(PHOTO).convert("RGB"), return_tensors="np")
        got = vitc.load_model(d).preprocess(PHOTO)
        self.assertEqual(got.shape, (3, 32, 32))
        np.testing.assert_array_equal(got, want["pixel_values"][0])
        pp = os.path.join(d, "preprocessor_config.json")
        edit_json(pp, lambda o: o.update(image_mean=[0.25], image_std=[0.5]))
        np.testing.assert_array_equal(vitc.load_model(d).preprocess(PHOTO), got)
        edit_json(pp, lambda o: o.update(image_mean=[0.1, "x", 0.2]))
        msg, _ = load_child(d)
        self.assertIn("image_mean must be a number or a list of 1 or 3 numbers", msg)

    def test_gray_model_preprocess_one_plane(self):
        """num_channels 1: vitc_vit_preprocess wrote 3 planes (the binding
        returned them); now 1, the luminance as PIL's convert("L"), equal to
        transformers' processor on the gray image."""
        d, _ = self.hub_vit("gray", num_channels=1)
        T.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5],
                            image_std=[0.5]).save_pretrained(d)
        proc = T.AutoImageProcessor.from_pretrained(d, backend="pil")
        m = vitc.load_model(d)
        for name in ("photo.png", "photo.jpg", "rgb8.png"):
            p = os.path.join(DATA, name)
            want = proc(images=Image.open(p).convert("L"), return_tensors="np")["pixel_values"]
            got = m.preprocess(p)
            self.assertEqual(got.shape, (1, 32, 32))
            np.testing.assert_array_equal(got, want[0], err_msg=name)


if __name__ == "__main__":
    unittest.main()
