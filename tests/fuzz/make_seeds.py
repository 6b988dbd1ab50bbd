"""Write the fuzz targets' seed corpora, tests/fuzz/corpus/<target>/.

    .venv/bin/python tests/fuzz/make_seeds.py

Run once; the outputs are committed. Seeds are small valid inputs plus a few
near misses, so the fuzzer starts from every branch of the parsers rather
than from the first bytes. Image seeds are copies of small fixtures in
tests/data plus a few shapes made here.
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

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import st_write  # noqa: E402


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def st_bytes(tensors, metadata=None, bf16=()):
    tmp = os.path.join(OUT, ".tmp.safetensors")
    st_write.write(tmp, tensors, metadata, bf16)
    with open(tmp, "rb") as f:
        b = f.read()
    os.remove(tmp)
    return b


def raw_st(header):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h


def safetensors_seeds():
    r = np.random.default_rng(0)
    f32 = r.standard_normal((2, 3)).astype(np.float32)
    put("safetensors", "f32.st", st_bytes({"w": f32}))
    put("safetensors", "mixed.st", st_bytes(
        {"a": f32, "h": f32.astype(np.float16), "b": f32, "i": np.arange(4, dtype=np.int64),
         "u": np.arange(5, dtype=np.uint8), "m": np.array([True, False])},
        {"k": "v", "vitc.config": "{}"}, bf16=("b",)))
    put("safetensors", "scalar.st", st_bytes({"s": np.float32(1.5).reshape(())}))
    put("safetensors", "empty_tensor.st", st_bytes({"e": np.zeros((0, 4), np.float32)}))
    put("safetensors", "no_tensors.st", raw_st({}))
    put("safetensors", "meta_only.st", raw_st({"__metadata__": {"a": "b"}}))
    put("safetensors", "overlap.st", raw_st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                             "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}) + bytes(4))
    put("safetensors", "lying_len.st", struct.pack("<Q", 1 << 40) + b"{}")
    put("safetensors", "rank4.st", st_bytes({"t": np.ones((1, 2, 1, 2), np.float32)}))
    put("safetensors", "unicode_name.st", st_bytes({"wé\u00e9ight": f32}))


def vit_config_seeds():
    tiny = dict(image_size=8, patch_size=4, in_channels=3, hidden_dim=8, depth=1, num_heads=2,
                mlp_dim=16, num_classes=3)
    put("vit_config", "tiny.json", json.dumps(tiny))
    put("vit_config", "tiny_labels.json", json.dumps(dict(tiny, labels=["a", "b", "c"])))
    put("vit_config", "tiny_norm.json", json.dumps(dict(
        tiny, norm_eps=1e-6, mean=[0.5, 0.5, 0.5], std=[0.25, 0.5, 1.0], num_heads=4)))
    put("vit_config", "heads8.json", json.dumps(dict(tiny, num_heads=8, labels=None)))
    put("vit_config", "in4.json", json.dumps(dict(tiny, in_channels=4)))
    put("vit_config", "in64.json", json.dumps(dict(tiny, in_channels=64)))
    put("vit_config", "wrong_labels.json", json.dumps(dict(tiny, labels=["a", 1])))
    put("vit_config", "float_ints.json", json.dumps(dict(tiny, depth=1.0, mlp_dim=16.5)))
    put("vit_config", "huge.json", json.dumps(dict(tiny, hidden_dim=2 ** 31, depth=10 ** 9)))
    put("vit_config", "empty.json", "{}")
    put("vit_config", "array.json", "[]")
    put("vit_config", "nested.json", "[" * 64 + "]" * 64)
    put("vit_config", "bad_eps.json", json.dumps(dict(tiny, norm_eps=-1, std=[0, 1, 1])))
    put("vit_config", "timm_keys.json", json.dumps({"img_size": 8, "embed_dim": 8}))


def image_seeds():
    for name in ("gray1.png", "gray2.png", "gray4.png", "gray8.png", "gray16.png",
                 "gray_alpha.png", "gray_alpha_interlaced.png", "gray8_trns.png", "palette.png",
                 "palette_trns.png", "rgb8.png", "rgb8_interlaced.png", "rgb16.png", "rgba8.png",
                 "rgba16.png", "bad_crc.png", "lying_header.png", "gray.jpg", "cmyk.jpg",
                 "progressive.jpg", "rgb444.jpg", "lying_header.jpg", "photo.jpg"):
        shutil.copy(os.path.join(ROOT, "tests", "data", name), os.path.join(OUT, "image", name))
    r = np.random.default_rng(1)
    for w, h in ((1, 1), (300, 1), (1, 300), (225, 224)):
        a = r.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if w * h > 1000:  # noise would not compress: a gradient keeps the seed small
            a = (np.add.outer(np.arange(h), np.arange(w)) % 256).astype(np.uint8)[..., None]
            a = np.repeat(a, 3, axis=2)
        for fmt in ("PNG", "JPEG"):
            b = io.BytesIO()
            Image.fromarray(a).save(b, fmt)
            put("image", "%dx%d.%s" % (w, h, fmt.lower()), b.getvalue())


def labels_seeds():
    def seed(n, text):
        return struct.pack("<H", n - 1) + text

    put("labels", "three.txt", seed(3, b"cat\ndog\nbird\n"))
    put("labels", "crlf.txt", seed(2, b"tabby, tabby cat\r\nEgyptian cat\r\n"))
    put("labels", "no_final_newline.txt", seed(2, b"a\nb"))
    put("labels", "too_few.txt", seed(5, b"a\nb\n"))
    put("labels", "too_many.txt", seed(1, b"a\nb\nc\n"))
    put("labels", "control.txt", seed(3, b"\x1b[2J\nnul\x00in\n\r\r\n"))
    put("labels", "utf8.txt", seed(2, "caf\u00e9\n\u732b\n".encode()))
    put("labels", "empty.txt", seed(1, b""))
    put("labels", "blank_lines.txt", seed(4, b"\n\n\n\n"))
    put("labels", "long_line.txt", seed(1, b"x" * 4000 + b"\n"))


def cli_args_seeds():
    # First byte: positional arguments the spec takes (byte % 4 - 1, -1 = any).
    def seed(max_pos, *args):
        return bytes([max_pos + 1]) + b"\0".join(a.encode() for a in args)

    put("cli_args", "basic.args", seed(-1, "--model", "m.st", "a.png", "b.png"))
    put("cli_args", "all.args", seed(
        -1, "--model=m.st", "--method", "cls", "--topk", "3", "--crop", "224", "--threads=2",
        "--alpha", "0.25", "--json", "-q", "--", "-x.png", "--topk"))
    put("cli_args", "one_positional.args", seed(1, "--model", "m", "a", "b"))
    put("cli_args", "no_positional.args", seed(0, "file"))
    put("cli_args", "bad_numbers.args", seed(
        -1, "--topk", "", "--crop=0x10", "--threads", "1e3", "--alpha", "nan"))
    put("cli_args", "flag_with_value.args", seed(-1, "--json=1", "-q"))
    put("cli_args", "missing_value.args", seed(-1, "--model"))
    put("cli_args", "help.args", seed(-1, "a", "--help"))
    put("cli_args", "unknown.args", seed(-1, "--modelx", "m", "--\x1b[2J"))


def idx_seeds():
    """idx: byte 0 the batch options, bytes 1-2 (LE) the images file's length,
    then the images file and the labels file (tests/fuzz/idx.c)."""
    import gzip

    def images(n, side, magic=0x0803):
        hdr = struct.pack(">IIII", magic, n, side, side)
        return hdr + bytes((i * 37 + 11) % 256 for i in range(n * side * side))

    def labels(ys, magic=0x0801):
        return struct.pack(">II", magic, len(ys)) + bytes(ys)

    def seed(opt, im, lb):
        return bytes([opt]) + struct.pack("<H", len(im)) + im + lb

    put("idx", "raw_3x5.idx", seed(0, images(3, 5), labels([0, 9, 4])))
    put("idx", "augment_rgb.idx", seed(0x1F, images(4, 6), labels([1, 2, 3, 9])))
    put("idx", "gzip.idx", seed(0x22, gzip.compress(images(2, 7)), gzip.compress(labels([5, 6]))))
    put("idx", "count_mismatch.idx", seed(0, images(3, 5), labels([0, 1])))
    put("idx", "trailing.idx", seed(0, images(2, 4) + b"x", labels([0, 1])))
    put("idx", "bad_type.idx", seed(0, images(2, 4, magic=0x0D03), labels([0, 1])))
    put("idx", "huge_dims.idx", seed(0, struct.pack(">IIII", 0x0803, 0xFFFFFFFF, 0x10000, 0x10000),
                                       labels([0])))


def serve_seeds():
    """fuzz_serve: a mode byte (fuzz_serve.c says what its bits pick), then a
    request body; raw bodies are TOP_K NUL FORMAT NUL IMAGE."""
    import base64
    rng = np.random.default_rng(3)

    def enc(fmt, w, h, mode="RGB"):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).convert(mode).save(
            b, fmt)
        return b.getvalue()
    png, jpg, gray = enc("PNG", 8, 6), enc("JPEG", 12, 10), enc("PNG", 5, 7, "L")
    b64 = lambda b: base64.b64encode(b).decode()
    url = lambda mime, b: "data:%s;base64,%s" % (mime, b64(b))
    body = lambda mode, obj: bytes([mode]) + (obj if isinstance(obj, bytes)
                                               else json.dumps(obj).encode())
    put("fuzz_serve", "embed_png", body(0x10, {"input": [url("image/png", png)]}))
    put("fuzz_serve", "embed_b64", body(0x20, {"input": b64(jpg), "encoding_format": "base64"}))
    put("fuzz_serve", "classify_topk", body(0x12, {"input": [{"image": b64(jpg)}, url(
        "image/png", gray)], "top_k": 3}))
    put("fuzz_serve", "texts", body(0x14, {"input": ["a cat", {"text": "two dogs"},
                                                      url("image/jpeg", jpg)]}))
    put("fuzz_serve", "gray_model", body(0x38, {"input": [b64(png)], "model": "m"}))
    put("fuzz_serve", "url_safe", body(0x10, {"input": b64(png).replace("+", "-").replace(
        "/", "_").rstrip("=")}))
    put("fuzz_serve", "raw_png", body(0x13, b"3\0\0" + png))
    put("fuzz_serve", "raw_jpeg", body(0x11, b"\0base64\0" + jpg))
    # near misses: each refusal's branch
    put("fuzz_serve", "malformed", body(0x10, b'{"input": ['))
    put("fuzz_serve", "bad_b64", body(0x10, {"input": ["ab!c"]}))
    put("fuzz_serve", "pad_then_data", body(0x10, {"input": ["QQ==QQ"]}))
    put("fuzz_serve", "url_not_b64", body(0x10, {"input": ["data:image/png,abc"]}))
    put("fuzz_serve", "not_image", body(0x10, {"input": [b64(b"hello, not an image")]}))
    ihdr = struct.pack(">IIBBBBB", 200000, 200000, 8, 2, 0, 0, 0)
    chunk = lambda t, d: (struct.pack(">I", len(d)) + t + d
                          + struct.pack(">I", zlib.crc32(t + d)))
    huge = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")
    put("fuzz_serve", "huge_png", body(0x10, {"input": [b64(huge)]}))
    put("fuzz_serve", "too_many", body(0x10, {"input": [b64(png)] * 9}))
    put("fuzz_serve", "bad_topk", body(0x12, {"input": [b64(png)], "top_k": 0}))
    put("fuzz_serve", "raw_bad_topk", body(0x13, b"x\0\0" + png))


if __name__ == "__main__":
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(os.path.join(OUT, "image"))
    safetensors_seeds()
    vit_config_seeds()
    image_seeds()
    labels_seeds()
    cli_args_seeds()
    idx_seeds()
    serve_seeds()
