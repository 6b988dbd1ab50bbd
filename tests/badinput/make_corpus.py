"""Write the bad-input corpus: tests/badinput/files/ and manifest.json.

    .venv/bin/python tests/badinput/make_corpus.py

Run once; the outputs are committed and tests/python/test_badinput.py feeds
each to the vitc command the manifest names. Every file is small (extreme
images are mostly one colour and compress to a few hundred bytes); inputs
that cannot be committed (FIFOs, device nodes, a full file system, a 3 MB
header) are made by the runner at test time from the manifest's "setup".

A case: {"name", "args": [...], "expect", "defect"?, "setup"?, "outputs"?}
  args     the vitc arguments; {f} is this case's file, {model} the valid
           tiny ViT, {labels} its valid labels file, {out}/{raw} output
           paths that exist before the run (their bytes must survive a
           failure), {tmp} a fresh directory, {setup} what "setup" made.
  expect   "error": exit 1, one line "vitc: error: ..." on stderr;
           "usage": exit 2, "vitc: error: ..." (and the "Try" hint);
           "clean": exit 0, no control characters on stdout;
           "bounded": exit 0, or exit 1 as "error" (a valid but extreme
           input: only the time and memory bounds are the point).
  defect   the issue-7 defect the case reproduces, if any.
"""
import io
import json
import os
import shutil
import struct
import sys
import zlib

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FILES = os.path.join(HERE, "files")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import st_write  # noqa: E402

CASES = []
TINY = dict(image_size=8, patch_size=4, in_channels=3, hidden_dim=8, depth=1, num_heads=2,
            mlp_dim=16, num_classes=3)


def case(name, args, expect, defect=None, setup=None, data=None):
    """Record a case; `data` (bytes) is written as files/<name>."""
    if data is not None:
        with open(os.path.join(FILES, name), "wb") as f:
            f.write(data)
    c = {"name": name, "args": args, "expect": expect}
    if defect:
        c["defect"] = defect
    if setup:
        c["setup"] = setup
    CASES.append(c)


# ---------------------------------------------------------------- models

def vit_tensors(cfg, seed=0):
    """A torchvision-named ViT with random weights for `cfg`."""
    r = np.random.default_rng(seed)
    D, M, C, p = cfg["hidden_dim"], cfg["mlp_dim"], cfg["in_channels"], cfg["patch_size"]
    n = (cfg["image_size"] // p) ** 2 + 1

    def t(*shape):
        return (0.3 * r.standard_normal(shape)).astype(np.float32)

    ts = {"class_token": t(1, 1, D), "conv_proj.weight": t(D, C, p, p), "conv_proj.bias": t(D),
          "encoder.pos_embedding": t(1, n, D), "encoder.ln.weight": 1 + t(D),
          "encoder.ln.bias": t(D), "heads.head.weight": t(cfg["num_classes"], D),
          "heads.head.bias": t(cfg["num_classes"])}
    for i in range(cfg["depth"]):
        pre = "encoder.layers.encoder_layer_%d." % i
        for k, s in (("ln_1.weight", (D,)), ("ln_1.bias", (D,)),
                     ("self_attention.in_proj_weight", (3 * D, D)),
                     ("self_attention.in_proj_bias", (3 * D,)),
                     ("self_attention.out_proj.weight", (D, D)),
                     ("self_attention.out_proj.bias", (D,)), ("ln_2.weight", (D,)),
                     ("ln_2.bias", (D,)), ("mlp.0.weight", (M, D)), ("mlp.0.bias", (M,)),
                     ("mlp.3.weight", (D, M)), ("mlp.3.bias", (D,))):
            ts[pre + k] = t(*s)
    return ts


def st_bytes(tensors, metadata=None):
    tmp = os.path.join(FILES, ".tmp")
    st_write.write(tmp, tensors, metadata)
    with open(tmp, "rb") as f:
        b = f.read()
    os.remove(tmp)
    return b


def model(cfg, tensors=None, config=None):
    return st_bytes(tensors if tensors is not None else vit_tensors(cfg),
                    {"vitc.config": config if config is not None else json.dumps(cfg)})


def raw_st(header, data=b"", length=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


# ---------------------------------------------------------------- images

def png_chunk(kind, body, crc=None):
    c = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", c & 0xffffffff)


def png(w, h, ctype=0, depth=8, rows=None, ihdr_crc=None, idat=True):
    """A PNG of one gray value (or given raw filtered rows), built by hand so
    any header field can lie."""
    ch = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
    if rows is None:
        row = b"\0" + bytes(max(1, (w * ch * depth + 7) // 8))
        raw = row * max(h, 1) if w * h else b""
    else:
        raw = rows
    out = b"\x89PNG\r\n\x1a\n"
    out += png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0), ihdr_crc)
    if idat:
        out += png_chunk(b"IDAT", zlib.compress(raw, 9))
    return out + png_chunk(b"IEND", b"")


def pil_bytes(arr, fmt, **kw):
    b = io.BytesIO()
    Image.fromarray(arr).save(b, fmt, **kw)
    return b.getvalue()


def jpeg_set_size(data, w, h):
    """Rewrite the SOF0 frame size of a baseline JPEG."""
    i = data.index(b"\xff\xc0")
    return data[:i + 5] + struct.pack(">HH", h, w) + data[i + 9:]


# ---------------------------------------------------------------- corpus

def models():
    case("model_ok.safetensors", [], None, data=model(TINY))
    CASES.pop()  # a fixture, not a case
    with open(os.path.join(FILES, "labels_ok.txt"), "w") as f:
        f.write("cat\ndog\nbird\n")
    cl = ["classify", "--quiet", "--model", "{f}", os.path.join("tests", "data", "rgb8.png")]
    am = ["attention-map", "--model", "{f}", "--out", "{out}", os.path.join("tests", "data",
                                                                            "rgb8.png")]
    for c in (4, 64):
        cfg = dict(TINY, in_channels=c)
        case("in_channels_%d.safetensors" % c, cl, "error", defect=1, data=model(cfg))
        CASES.append({"name": "in_channels_%d.safetensors" % c, "args": am, "expect": "error",
                      "defect": 1})
    bad = vit_tensors(TINY)
    del bad["encoder.ln.bias"]
    case("vit_missing_tensor.safetensors", cl, "error", data=model(TINY, bad))
    bad = vit_tensors(TINY)
    bad["heads.head.weight"] = bad["heads.head.weight"][:, :4].copy()
    case("vit_wrong_shape.safetensors", cl, "error", data=model(TINY, bad))
    bad = vit_tensors(TINY)
    bad["extra"] = np.zeros(3, np.float32)
    case("vit_extra_tensor.safetensors", cl, "error", data=model(TINY, bad))
    case("vit_config_not_json.safetensors", cl, "error", data=model(TINY, config="{depth: 1"))
    case("vit_config_array.safetensors", cl, "error", data=model(TINY, config="[1, 2]"))
    case("vit_config_depth_huge.safetensors", cl, "error",
         data=model(TINY, config=json.dumps(dict(TINY, depth=10 ** 9))))
    case("vit_config_dim_huge.safetensors", cl, "error",
         data=model(TINY, config=json.dumps(dict(TINY, hidden_dim=2 ** 31 - 1, mlp_dim=2 ** 31 - 1))))
    case("vit_config_heads.safetensors", cl, "error",
         data=model(TINY, config=json.dumps(dict(TINY, num_heads=3))))
    case("vit_config_labels_count.safetensors", cl, "error",
         data=model(TINY, config=json.dumps(dict(TINY, labels=["a", "b"]))))
    case("vit_config_nan_std.safetensors", cl, "error",
         data=model(TINY, config=json.dumps(dict(TINY, std=[0, 1, 1]))))
    case("vit_config_deep.safetensors", cl, "error",
         data=model(TINY, config="[" * 10000 + "]" * 10000))
    ctrl = dict(TINY, labels=["\x1b[2Jcleared", "cr\rreturn", "nl\nnewline"])
    case("vit_labels_control.safetensors", ["classify", "--quiet", "--model", "{f}",
                                            os.path.join("tests", "data", "rgb8.png")],
         "clean", defect=8, data=model(TINY, config=json.dumps(ctrl)))
    case("inspect_arch_mismatch", ["inspect", "--arch", "vit_b_16", "{model}"], "error", defect=7)


def safetensors():
    ok = open(os.path.join(FILES, "model_ok.safetensors"), "rb").read()
    good = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    files = {
        "st_empty.safetensors": b"",
        "st_4_bytes.safetensors": b"\x02\0\0\0",
        "st_length_only.safetensors": struct.pack("<Q", 2),
        "st_length_huge.safetensors": struct.pack("<Q", 2 ** 63) + b"{}",
        "st_length_past_end.safetensors": raw_st({"a": good}, bytes(8), length=4096),
        "st_truncated_header.safetensors": ok[:40],
        "st_truncated_data.safetensors": ok[:len(ok) - 100],
        "st_header_not_json.safetensors": raw_st(b"{not json}"),
        "st_header_array.safetensors": raw_st(b"[1,2,3]"),
        "st_header_nul.safetensors": raw_st(b'{"a\0b": 1}'),
        "st_dtype_unknown.safetensors": raw_st({"a": dict(good, dtype="F128")}, bytes(8)),
        "st_shape_negative.safetensors": raw_st({"a": dict(good, shape=[-2])}, bytes(8)),
        "st_shape_float.safetensors": raw_st({"a": dict(good, shape=[2.0])}, bytes(8)),
        "st_shape_overflow.safetensors": raw_st(
            {"a": dict(good, shape=[2 ** 62, 2 ** 62], data_offsets=[0, 8])}, bytes(8)),
        "st_offsets_past_end.safetensors": raw_st({"a": dict(good, data_offsets=[0, 1 << 40])},
                                                  bytes(8)),
        "st_offsets_lying.safetensors": raw_st({"a": dict(good, data_offsets=[4, 12])}, bytes(8)),
        "st_offsets_reversed.safetensors": raw_st({"a": dict(good, data_offsets=[8, 0])},
                                                  bytes(8)),
        "st_offsets_u64max.safetensors": raw_st(
            {"a": dict(good, data_offsets=[2 ** 64 - 8, 2 ** 64 - 1])}, bytes(8)),
        "st_overlap.safetensors": raw_st({"a": good, "b": good}, bytes(8)),
        "st_hole.safetensors": raw_st({"a": dict(good, data_offsets=[8, 16])}, bytes(16)),
        "st_rank_40.safetensors": raw_st({"a": dict(good, shape=[1] * 39 + [2])}, bytes(8)),
        "st_metadata_not_string.safetensors": raw_st({"__metadata__": {"k": 1}, "a": good},
                                                     bytes(8)),
        "st_duplicate_key.safetensors": raw_st(
            b'{"a":' + json.dumps(good).encode() + b',"a":' + json.dumps(good).encode() + b"}",
            bytes(8)),
        "st_deep_nesting.safetensors": raw_st(b"[" * 10000 + b"]" * 10000),
        "st_many_empty_objects.safetensors": raw_st(
            b"{" + b",".join(b'"%d":{}' % i for i in range(5000)) + b"}"),
        "st_not_safetensors.safetensors": b"PK\x03\x04 this is a zip, not safetensors",
    }
    for name, data in files.items():
        # Rank 40 is valid safetensors (only the Python binding caps it, defect 10).
        case(name, ["inspect", "{f}"], "bounded" if "rank" in name else "error", data=data)
    for name in ("st_length_huge.safetensors", "st_overlap.safetensors",
                 "st_truncated_data.safetensors"):
        CASES.append({"name": name, "args": ["classify", "--model", "{f}", "--quiet",
                                             os.path.join("tests", "data", "rgb8.png")],
                      "expect": "error"})
    # A 3 MB header of empty objects: 78x its size in the old parser (defect 4).
    case("st_huge_header", ["inspect", "{setup}"], "error", defect=4,
         setup={"kind": "huge_header", "objects": 300000})


def images():
    am = ["attention-map", "--model", "{model}", "--out", "{out}", "{f}"]
    cl = ["classify", "--quiet", "--model", "{model}", "{f}"]
    photo = open(os.path.join(ROOT, "tests", "data", "photo.jpg"), "rb").read()
    rgb = open(os.path.join(ROOT, "tests", "data", "rgb8.png"), "rb").read()
    small = pil_bytes(np.full((16, 16, 3), 90, np.uint8), "JPEG")
    bad = {
        "png_empty.png": b"",
        "png_signature_only.png": rgb[:8],
        "png_truncated_ihdr.png": rgb[:20],
        "png_truncated_half.png": rgb[:len(rgb) // 2],
        "png_no_iend_no_idat.png": rgb[:33],
        "png_bad_crc_ihdr.png": png(4, 4, ihdr_crc=0x12345678),
        "png_zero_width.png": png(0, 4),
        "png_zero_both.png": png(0, 0),
        "png_huge_dims.png": png(100000, 100000, rows=b"\0" * 64),
        "png_2g_wide.png": png(2 ** 31 - 1, 1, rows=b"\0" * 64),
        "png_width_u32max.png": png(2 ** 32 - 1, 1, rows=b"\0" * 64),
        "png_no_idat.png": png(4, 4, idat=False),
        "png_bad_zlib.png": png(4, 4)[:33] + png_chunk(b"IDAT", b"\x78\x9cgarbage") +
        png_chunk(b"IEND", b""),
        "png_short_idat.png": png(64, 64, rows=b"\0" * 10),
        "png_bad_depth.png": png(4, 4, depth=7),
        "png_bad_colortype.png": png(4, 4)[:8] + png_chunk(
            b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 5, 0, 0, 0)) + png(4, 4)[33:],
        "png_text_named.png": b"just text in a .png file\n",
        "jpg_truncated_soi.jpg": photo[:3],
        "jpg_truncated_header.jpg": photo[:200],
        "jpg_truncated_half.jpg": photo[:len(photo) // 2],
        "jpg_soi_eoi.jpg": b"\xff\xd8\xff\xd9",
        "jpg_garbage.jpg": b"\xff\xd8\xff" + bytes(range(256)) * 4,
        "jpg_huge_dims.jpg": jpeg_set_size(small, 65500, 65500),
        "jpg_zero_height.jpg": jpeg_set_size(small, 16, 0),
        "jpg_zero_width.jpg": jpeg_set_size(small, 0, 16),
        "jpg_lying_dims.jpg": jpeg_set_size(small, 4000, 3000),
    }
    for name, data in bad.items():
        # Dimensions larger than the data: libjpeg fills in gray with a warning
        # and PIL loads it too, so it is an image, only a suspicious one.
        case(name, am if name.endswith("half.png") or name.endswith("dims.jpg") else cl,
             "bounded" if name == "jpg_lying_dims.jpg" else "error", data=data)
    shutil.copy(os.path.join(ROOT, "tests", "data", "cmyk.jpg"), os.path.join(FILES, "cmyk.jpg"))
    case("cmyk.jpg", cl, "error")
    # Extreme aspect ratios: valid, tiny on disk, huge once resized (defect 3).
    for w, h in ((100000, 1), (1, 100000), (1000000, 1), (1, 1000000)):
        name = "png_%dx%d.png" % (w, h)
        case(name, cl, "bounded", defect=3, data=png(w, h))
        CASES.append({"name": name, "args": am, "expect": "bounded", "defect": 3})
    case("jpg_65500x1.jpg", cl, "bounded", defect=3,
         data=pil_bytes(np.full((1, 65500, 3), 200, np.uint8), "JPEG"))
    case("png_1x1.png", am, "bounded", data=png(1, 1, ctype=2))


def labels():
    cl = ["classify", "--quiet", "--model", "{model}", "--labels", "{f}",
          os.path.join("tests", "data", "rgb8.png")]
    files = {
        "labels_empty.txt": (b"", "error"),
        "labels_too_few.txt": (b"cat\ndog\n", "error"),
        "labels_too_many.txt": (b"a\nb\nc\nd\ne\n", "error"),
        "labels_control.txt": (b"\x1b[2J\x1b[31mred\nbell\x07\rover\nesc\x1b]0;title\x07\n",
                               "clean"),
        "labels_nul.txt": (b"c\0at\ndog\nbird\n", "clean"),
        "labels_not_utf8.txt": (b"\xff\xfe\xfd\ndog\n\xc3\n", "clean"),
        "labels_only_cr.txt": (b"a\rb\rc\r", "error"),
        "labels_huge_line.txt": (b"x" * 100000 + b"\ndog\nbird\n", "bounded"),
        "labels_100000_lines.txt": (b"\n" * 100000, "error"),
    }
    for name, (data, expect) in files.items():
        case(name, cl, expect, defect=8 if name in ("labels_control.txt",) else None, data=data)


def usage():
    """Numeric options: empty, trailing garbage, out of range (defect 11)."""
    img = os.path.join("tests", "data", "rgb8.png")
    am = ["attention-map", "--model", "{model}", "--out", "{out}"]
    cl = ["classify", "--model", "{model}"]
    for i, extra in enumerate((["--alpha", ""], ["--alpha", "0.5x"], ["--alpha", "nan"],
                               ["--alpha", " "], ["--crop", ""], ["--crop", "8 "],
                               ["--resize", "0x10"], ["--threads", "-1"])):
        case("usage_am_%d" % i, am + extra + [img], "usage",
             defect=11 if extra == ["--alpha", ""] else None)
    for i, extra in enumerate((["--topk", ""], ["--topk", "3x"], ["--batch", "0"],
                               ["--batch", "99999999999"], ["--crop", "1e3"],
                               ["--threads", "+"], ["--resize", "-5"], ["--topk"])):
        case("usage_classify_%d" % i, cl + extra + [img], "usage",
             defect=None)


def runtime():
    """Inputs the runner makes at test time."""
    img = os.path.join("tests", "data", "rgb8.png")
    cl = ["classify", "--quiet", "--model"]
    case("fifo_image", cl + ["{model}", "{setup}"], "error", defect=5, setup={"kind": "fifo"})
    case("fifo_model", cl + ["{setup}", img], "error", defect=5, setup={"kind": "fifo"})
    case("fifo_labels", cl + ["{model}", "--labels", "{setup}", img], "error", defect=5,
         setup={"kind": "fifo"})
    case("fifo_inspect", ["inspect", "{setup}"], "error", defect=5, setup={"kind": "fifo"})
    case("fifo_am_model", ["attention-map", "--model", "{setup}", "--out", "{out}", img], "error",
         defect=5, setup={"kind": "fifo"})
    case("dir_image", cl + ["{model}", "{tmp}"], "error")
    case("dir_model", cl + ["{tmp}", img], "error")
    case("dir_labels", cl + ["{model}", "--labels", "{tmp}", img], "error")
    case("missing_model", cl + ["{tmp}/missing.safetensors", img], "error")
    am = ["attention-map", "--model", "{model}"]
    case("out_device_node", am + ["--out", "{setup}", img], "error", defect=2,
         setup={"kind": "device"})
    case("raw_device_node", am + ["--out", "{out}", "--raw", "{setup}", img], "error", defect=2,
         setup={"kind": "device"})
    case("out_full_fs", am + ["--out", "{setup}", img], "error", defect=2,
         setup={"kind": "full_fs"})
    case("out_missing_dir", am + ["--out", "{tmp}/no/such/dir/out.png", img], "error")
    case("out_parent_is_file", am + ["--out", "{out}/out.png", img], "error")
    case("out_is_dir", am + ["--out", "{tmp}", img], "error")


def main():
    shutil.rmtree(FILES, ignore_errors=True)
    os.makedirs(FILES)
    models()
    safetensors()
    images()
    labels()
    usage()
    runtime()
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        json.dump(CASES, f, indent=1)
        f.write("\n")
    print("%d cases, %d files" % (len(CASES), len(os.listdir(FILES))))


if __name__ == "__main__":
    main()
