"""The commonest first-hour mistakes get one error line that names the fix:
a PyTorch checkpoint or an image given as the model, classify on a model
without a head, a misspelt option or command, an output name whose
extension promises a format the command does not write. And `vitc help
COMMAND` is COMMAND --help."""
import json
import os
import pickle
import struct
import unittest
import zipfile

import numpy as np

from tests.python.util import DATA, PHOTO, ROOT, TmpDirCase, run_vitc, torch

FASHION = os.path.join(ROOT, "models", "fashion-vit.safetensors")


class TestCLIErrors(TmpDirCase):

    def one_error(self, args, status, *needles):
        """vitc args exits with status and says one `vitc: error:` line
        (usage errors add the "Try" line) holding every needle; returns it."""
        rc, out, err = run_vitc(*args)
        self.assertEqual(rc, status, "vitc %s: exit %d\n%s" % (" ".join(map(str, args)), rc, err))
        lines = err.splitlines()
        errors = [l for l in lines if l.startswith("vitc: error: ")]
        self.assertEqual(len(errors), 1, err)
        self.assertEqual(len(lines), 2 if status == 2 else 1, err)
        if status == 2:
            self.assertTrue(lines[1].startswith("Try 'vitc"), err)
        for n in needles:
            self.assertIn(n, errors[0])
        return errors[0]

    # --- a model file that is not safetensors ---------------------------------

    def test_pytorch_zip_checkpoint(self):
        pth = self.path("vit_b_16.pth")
        if torch is not None:  # the real thing: torch.save's zip
            torch.save({"w": torch.zeros(3)}, pth)
        else:  # what torch.save writes: a zip holding data.pkl
            with zipfile.ZipFile(pth, "w") as z:
                z.writestr("archive/data.pkl", pickle.dumps({"w": [0.0] * 3}, protocol=2))
        for cmd in (["classify", "--model", pth, PHOTO], ["inspect", pth],
                    ["embed", "--model", pth, PHOTO]):
            e = self.one_error(cmd, 1, pth + " is a zip archive", "PyTorch checkpoint",
                               "tools/export_safetensors.py %s out.safetensors" % pth)
            self.assertNotIn("header length", e)

    def test_pytorch_pickle_checkpoint(self):
        pth = self.path("legacy.pt")
        if torch is not None:
            torch.save({"w": torch.zeros(3)}, pth, _use_new_zipfile_serialization=False)
        else:
            with open(pth, "wb") as f:
                pickle.dump({"w": [0.0] * 3}, f, protocol=2)
        for proto in (2, 5):
            p = self.path("p%d.bin" % proto)
            with open(p, "wb") as f:
                pickle.dump({"w": [0.0] * 3}, f, protocol=proto)
            self.one_error(["classify", "--model", p, PHOTO], 1, "is a Python pickle",
                           "tools/export_safetensors.py %s out.safetensors" % p)
        self.one_error(["classify", "--model", pth, PHOTO], 1, pth + " is a Python pickle",
                       "PyTorch checkpoint", "export_safetensors.py")

    def test_image_as_model(self):
        jpg = os.path.join(DATA, "rgb444.jpg")
        gif = self.path("a.gif")
        with open(gif, "wb") as f:
            f.write(b"GIF89a" + b"\x01\x00\x01\x00" + b"\0" * 40)
        for path, kind in ((PHOTO, "a PNG image"), (jpg, "a JPEG image"), (gif, "a GIF image")):
            self.one_error(["classify", "--model", path, PHOTO], 1,
                           "%s is %s, not a model" % (path, kind))

    def test_real_safetensors_unaffected(self):
        # A header length whose low bytes look like a pickle's (0x80 0x02 ..)
        # is a plausible safetensors header: only an impossible length may
        # be taken for another format.
        hdr = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
        hdr += b" " * (0x0280 - len(hdr))
        p = self.path("ok.safetensors")
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(hdr)) + hdr + np.float32(1.5).tobytes())
        rc, out, err = run_vitc("inspect", p)
        self.assertEqual(rc, 0, err)
        self.assertIn("w", out)

    # --- classify on a backbone ------------------------------------------------

    @unittest.skipIf(torch is None, "the Hub backbone is written with torch")
    def test_classify_backbone_points_to_embed(self):
        from tests.python.util import reference_modules
        hf_ref, = reference_modules("hf_ref")
        cfg = hf_ref.vit_config("vit", "ViTModel")
        d = self.path("backbone")
        hf_ref.save_hub(d, hf_ref.random_state(cfg, 0), cfg)
        e = self.one_error(["classify", "--model", d, PHOTO], 1, "no classification head",
                           "vitc embed")
        self.assertNotIn("vitc_vit_embed", e)
        e = self.one_error(["eval", "--model", d, "--data", self.tmp], 1,
                           "no classification head", "vitc embed")
        rc, out, err = run_vitc("embed", "--model", d, PHOTO)
        self.assertEqual(rc, 0, err)

    # --- help and typos --------------------------------------------------------

    def test_help_command(self):
        rc, want, err = run_vitc("classify", "--help")
        self.assertEqual(rc, 0)
        for cmd in ("classify", "embed", "attention-map", "train", "plot-log"):
            rc, out, err = run_vitc("help", cmd)
            self.assertEqual((rc, err), (0, ""), cmd)
            self.assertEqual(out, run_vitc(cmd, "--help")[1], cmd)
            self.assertIn("usage: vitc " + cmd, out)
        rc, out, _ = run_vitc("help")
        self.assertEqual(rc, 0)
        self.assertIn("commands:", out)
        self.assertIn("Platforms: x86-64 Linux", out)  # what runs where, said up front
        self.one_error(["help", "clasify"], 2, "unknown command 'clasify'",
                       "did you mean 'classify'?")
        self.one_error(["help", "classify", "embed"], 2, "one command")

    def test_unknown_option_suggests(self):
        for args, typo, near in ((["classify", "--modle", "m", "x.png"], "--modle", "--model"),
                                 (["classify", "--top-k=3", "--model", "m", "x.png"], "--top-k=3",
                                  "--topk"),
                                 (["embed", "--normalise", "--model", "m", "x.png"], "--normalise",
                                  "--normalize"),
                                 (["attention-map", "--alhpa", "1"], "--alhpa", "--alpha"),
                                 (["train", "--epoch", "3"], "--epoch", "--epochs")):
            self.one_error(args, 2, "unknown option '%s'" % typo, "did you mean %s?" % near)
        # Nothing near: no guess.
        e = self.one_error(["classify", "--frobnicate", "x.png"], 2, "unknown option")
        self.assertNotIn("did you mean", e)
        self.one_error(["clasify", "x"], 2, "did you mean 'classify'?")
        e = self.one_error(["xyzzy"], 2, "unknown command 'xyzzy'")
        self.assertNotIn("did you mean", e)

    # --- output names ----------------------------------------------------------

    def test_output_extension_refused(self):
        cases = (
            (["attention-map", "--model", FASHION, "--out", "{}/x.jpg", PHOTO],
             "--out {}/x.jpg: attention-map writes PNG; name the file .png"),
            (["attention-map", "--model", FASHION, "--out", "{}/x.png", "--raw", "{}/r.txt",
              PHOTO], "--raw {}/r.txt: attention-map writes float32 .npy; name the file .npy"),
            (["embed", "--model", FASHION, "--out", "{}/e.txt", PHOTO],
             "--out {}/e.txt: embed writes a float32 .npy array or JSON; "
             "name the file .npy, .jsonl or .json"),
            (["eval", "--model", FASHION, "--data", "fashion-mnist", "--plot", "{}/cm.jpeg"],
             "--plot {}/cm.jpeg: eval writes PNG"),
            (["plot-log", "log.jsonl", "--out", "{}/c.svg"], "--out {}/c.svg: plot-log writes PNG"),
        )
        d = self.path("refused")
        os.mkdir(d)
        for args, msg in cases:
            args = [a.replace("{}", d) for a in args]
            self.one_error(args, 2, msg.replace("{}", d))
        self.assertEqual(os.listdir(d), [], "a refused run wrote a file")

    def test_embed_out_follows_extension(self):
        d = self.path("embed")
        os.mkdir(d)
        ref = os.path.join(d, "e.npy")
        rc, _, err = run_vitc("embed", "--model", FASHION, "--out", ref, PHOTO, PHOTO)
        self.assertEqual(rc, 0, err)
        want = np.load(ref)
        self.assertEqual(want.shape[0], 2)
        # Any case; a name without an extension gets .npy bytes.
        for name in ("E.NPY", "noext"):
            rc, _, err = run_vitc("embed", "--model", FASHION, "--out", os.path.join(d, name),
                                  PHOTO, PHOTO)
            self.assertEqual(rc, 0, err)
            np.testing.assert_array_equal(np.load(os.path.join(d, name)), want)
        rc, _, err = run_vitc("embed", "--model", FASHION, "--out", os.path.join(d, "e.jsonl"),
                              PHOTO, PHOTO)
        self.assertEqual(rc, 0, err)
        with open(os.path.join(d, "e.jsonl")) as f:
            rows = [json.loads(l) for l in f]
        self.assertEqual([r["image"] for r in rows], [PHOTO, PHOTO])
        np.testing.assert_allclose(np.array([r["embedding"] for r in rows]), want, rtol=1e-6)
        # .json: one JSON document, the same objects in an array; --json
        # still prints the lines as well.
        rc, out, err = run_vitc("embed", "--model", FASHION, "--out", os.path.join(d, "e.json"),
                                "--json", PHOTO, PHOTO)
        self.assertEqual(rc, 0, err)
        with open(os.path.join(d, "e.json")) as f:
            doc = json.load(f)
        self.assertEqual(doc, rows)
        self.assertEqual([json.loads(l) for l in out.splitlines()], rows)
        self.assertEqual(sorted(os.listdir(d)),
                         sorted(["e.npy", "E.NPY", "noext", "e.jsonl", "e.json"]))

    def test_attention_map_png_named_png(self):
        out = self.path("Map.PNG")
        rc, _, err = run_vitc("attention-map", "--model", FASHION, "--out", out, PHOTO)
        self.assertEqual(rc, 0, err)
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
