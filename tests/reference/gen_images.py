"""Write the image fixtures of tests/test_image.c into tests/data/.

Every kind of PNG the decoder must handle (gray 1/2/4/8/16 bits, gray+alpha,
RGB 8/16, RGBA, palette with and without transparency, Adam7 interlaced),
JPEGs (colour 4:2:0, 4:4:4, gray, progressive, CMYK), a synthetic photo, and
broken files. Next to each decodable image goes NAME.rgb: the pixels PIL
decodes, as raw [height, width, 3] bytes, and a line in images.txt:
`file width height expected.rgb tolerance`.

PIL cannot write 16-bit RGB, low-bit gray or interlaced PNGs, so those are
written by the small encoder below; PIL still decodes them for the expected
pixels (16-bit: the high byte, from the source array, see src/io/image.c).

Run from the repository root: .venv/bin/python tests/reference/gen_images.py
"""
import io
import os
import struct
import zlib

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def chunk(tag, data):
    c = struct.pack(">I", len(data)) + tag + data
    return c + struct.pack(">I", zlib.crc32(tag + data) & 0xffffffff)


def png_bytes(rows_fn, w, h, depth, ctype, interlace=False, extra=b""):
    """A PNG of w x h; rows_fn(x0, y0, dx, dy) -> list of packed rows for the
    sub-image (Adam7 pass) starting at (x0, y0) with strides (dx, dy)."""
    raw = b""
    if interlace:
        passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4),
                  (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    else:
        passes = [(0, 0, 1, 1)]
    for (x0, y0, dx, dy) in passes:
        if x0 >= w or y0 >= h:
            continue
        for row in rows_fn(x0, y0, dx, dy):
            raw += b"\x00" + row
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 1 if interlace else 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def pack_rows(arr, depth):
    """arr [h, w] or [h, w, c] integer samples -> packed big-endian rows."""
    def fn(x0, y0, dx, dy):
        sub = arr[y0::dy, x0::dx]
        rows = []
        for r in sub:
            flat = np.asarray(r).reshape(-1)
            if depth == 16:
                rows.append(flat.astype(">u2").tobytes())
            elif depth == 8:
                rows.append(flat.astype(np.uint8).tobytes())
            else:
                bits = "".join(format(int(v), "0%db" % depth) for v in flat)
                bits += "0" * (-len(bits) % 8)
                rows.append(bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)))
        return rows
    return fn


def photo(w=320, h=240):
    """A synthetic, photo-like scene: sky gradient, sun, hills, a house, a
    tree, noise and a blur, so it has edges, smooth areas and texture."""
    y = np.linspace(0, 1, h)[:, None]
    sky = np.stack([90 + 100 * y, 150 + 70 * y, 235 - 20 * y], -1) * np.ones((h, w, 1))
    img = Image.fromarray(sky.astype(np.uint8))
    d = ImageDraw.Draw(img)
    d.ellipse([w * 0.72, h * 0.08, w * 0.86, h * 0.27], fill=(255, 230, 120))
    d.polygon([(0, h * 0.62), (w * 0.3, h * 0.45), (w * 0.6, h * 0.6), (w, h * 0.5), (w, h), (0, h)],
              fill=(70, 140, 60))
    d.rectangle([w * 0.18, h * 0.55, w * 0.42, h * 0.85], fill=(200, 80, 60))
    d.polygon([(w * 0.15, h * 0.56), (w * 0.30, h * 0.38), (w * 0.45, h * 0.56)], fill=(110, 50, 40))
    d.rectangle([w * 0.27, h * 0.68, w * 0.33, h * 0.85], fill=(80, 50, 30))
    d.rectangle([w * 0.62, h * 0.55, w * 0.65, h * 0.82], fill=(90, 60, 30))
    d.ellipse([w * 0.55, h * 0.35, w * 0.72, h * 0.62], fill=(40, 110, 40))
    img = img.filter(ImageFilter.GaussianBlur(0.8))
    rng = np.random.default_rng(7)
    arr = np.asarray(img).astype(np.int16) + rng.integers(-6, 7, (h, w, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(1234)
    w, h = 37, 23  # odd sizes catch stride and interlace-pass mistakes
    manifest = []

    def save(name, data=None, pil=None, expected=None, tol=0):
        path = os.path.join(OUT, name)
        if pil is not None:
            pil.save(path, **(data or {}))
        else:
            with open(path, "wb") as f:
                f.write(data)
        if expected is None:
            expected = np.asarray(Image.open(path).convert("RGB"))
        expected = np.ascontiguousarray(expected, dtype=np.uint8)
        with open(path + ".rgb", "wb") as f:
            f.write(expected.tobytes())
        manifest.append("%s %d %d %s.rgb %d" % (name, expected.shape[1], expected.shape[0], name, tol))

    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (h, w), dtype=np.uint8)
    alpha = rng.integers(0, 256, (h, w), dtype=np.uint8)

    save("gray8.png", pil=Image.fromarray(gray, "L"))
    save("gray_alpha.png", pil=Image.fromarray(np.dstack([gray, alpha]), "LA"))
    save("rgb8.png", pil=Image.fromarray(rgb, "RGB"))
    save("rgba8.png", pil=Image.fromarray(np.dstack([rgb, alpha]), "RGBA"))
    pal = Image.fromarray(rgb, "RGB").quantize(colors=16)
    save("palette.png", pil=pal)
    pal_t = pal.copy()
    pal_t.info["transparency"] = 3
    save("palette_trns.png", pil=pal_t, data={"transparency": 3})
    for bits in (1, 2, 4):
        g = rng.integers(0, 1 << bits, (h, w))
        exp = (g * (255 // ((1 << bits) - 1))).astype(np.uint8)
        save("gray%d.png" % bits, png_bytes(pack_rows(g, bits), w, h, bits, 0),
             expected=np.dstack([exp] * 3))
    g16 = rng.integers(0, 65536, (h, w))
    save("gray16.png", png_bytes(pack_rows(g16, 16), w, h, 16, 0),
         expected=np.dstack([(g16 >> 8).astype(np.uint8)] * 3))
    rgb16 = rng.integers(0, 65536, (h, w, 3))
    save("rgb16.png", png_bytes(pack_rows(rgb16, 16), w, h, 16, 2),
         expected=(rgb16 >> 8).astype(np.uint8))
    rgba16 = rng.integers(0, 65536, (h, w, 4))
    save("rgba16.png", png_bytes(pack_rows(rgba16, 16), w, h, 16, 6),
         expected=(rgba16[..., :3] >> 8).astype(np.uint8))
    # Interlaced: PIL decodes them, as an independent check of the passes.
    save("rgb8_interlaced.png", png_bytes(pack_rows(rgb, 8), w, h, 8, 2, interlace=True))
    save("gray_alpha_interlaced.png",
         png_bytes(pack_rows(np.dstack([gray, alpha]), 8), w, h, 8, 4, interlace=True))
    # gray with a tRNS colour key: becomes gray+alpha in libpng, alpha dropped.
    save("gray8_trns.png", png_bytes(pack_rows(gray, 8), w, h, 8, 0,
                                     extra=chunk(b"tRNS", struct.pack(">H", int(gray[0, 0])))),
         expected=np.dstack([gray] * 3))

    ph = photo()
    ph.save(os.path.join(OUT, "photo.png"))
    save("photo.jpg", pil=ph, data={"quality": 90}, tol=1)
    small = Image.fromarray(rgb, "RGB").filter(ImageFilter.SMOOTH)
    save("rgb444.jpg", pil=small, data={"quality": 95, "subsampling": 0}, tol=1)
    save("gray.jpg", pil=Image.fromarray(gray, "L").filter(ImageFilter.SMOOTH),
         data={"quality": 90}, tol=1)
    save("progressive.jpg", pil=small, data={"quality": 90, "progressive": True}, tol=1)
    # JPEG tolerance 1: PIL and turbojpeg wrap the same libjpeg-turbo and
    # agree exactly here; 1 level leaves room for another IDCT build.
    # Refused and broken files (no manifest line; the C test names them).
    Image.fromarray(rgb[:8, :8], "RGB").convert("CMYK").save(os.path.join(OUT, "cmyk.jpg"))
    good_png = open(os.path.join(OUT, "rgb8.png"), "rb").read()
    good_jpg = open(os.path.join(OUT, "photo.jpg"), "rb").read()
    with open(os.path.join(OUT, "truncated.png"), "wb") as f:
        f.write(good_png[:len(good_png) // 2])
    with open(os.path.join(OUT, "truncated_header.png"), "wb") as f:
        f.write(good_png[:20])
    with open(os.path.join(OUT, "truncated.jpg"), "wb") as f:
        f.write(good_jpg[:len(good_jpg) // 2])
    with open(os.path.join(OUT, "truncated_header.jpg"), "wb") as f:
        f.write(good_jpg[:30])
    # IHDR claims 100000 x 100000 (10 gigapixels) with a valid CRC.
    lying = png_bytes(lambda *a: [b"\x00\x00\x00"], 1, 1, 8, 2)
    ihdr = struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
    lying = lying[:8] + chunk(b"IHDR", ihdr) + lying[8 + 25:]
    with open(os.path.join(OUT, "lying_header.png"), "wb") as f:
        f.write(lying)
    # A JPEG whose SOF claims 60000 x 60000.
    buf = io.BytesIO()
    Image.fromarray(rgb[:8, :8], "RGB").save(buf, "JPEG")
    j = bytearray(buf.getvalue())
    sof = j.index(b"\xff\xc0")
    j[sof + 5:sof + 9] = struct.pack(">HH", 60000, 60000)
    with open(os.path.join(OUT, "lying_header.jpg"), "wb") as f:
        f.write(bytes(j))
    # Bad CRC in IDAT: libpng must refuse it.
    bad = bytearray(good_png)
    idat = bad.index(b"IDAT")
    bad[idat + 10] ^= 0xff
    with open(os.path.join(OUT, "bad_crc.png"), "wb") as f:
        f.write(bytes(bad))
    open(os.path.join(OUT, "empty.png"), "wb").close()
    with open(os.path.join(OUT, "not_an_image.png"), "wb") as f:
        f.write(b"just some text, not an image\n")

    # torchvision's eval transform on uint8 tensors (the tensor path, with
    # antialias=True as vitc does), float32 [3, crop, crop] raw files.
    import torch
    import torchvision.transforms.functional as TF
    for (src, resize, crop) in (("photo.png", 64, 56), ("gray8.png", 40, 48), ("rgb8.png", 0, 21)):
        t = torch.from_numpy(np.array(Image.open(os.path.join(OUT, src)).convert("RGB")))
        t = t.permute(2, 0, 1).contiguous()
        if resize:
            t = TF.resize(t, [resize], antialias=True)
        t = TF.center_crop(t, [crop])
        t = TF.normalize(TF.convert_image_dtype(t, torch.float), mean=[0.485, 0.456, 0.406],
                         std=[0.229, 0.224, 0.225])
        name = "%s_pre_%d_%d.f32" % (src.split(".")[0], resize, crop)
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(t.numpy().astype("<f4").tobytes())

    with open(os.path.join(OUT, "images.txt"), "w") as f:
        f.write("# file width height expected tolerance (written by tests/reference/gen_images.py)\n")
        f.write("\n".join(manifest) + "\n")


if __name__ == "__main__":
    main()
