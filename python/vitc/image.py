"""Images: decoding (PNG, JPEG) and torchvision-style preprocessing, in C."""
import ctypes

import numpy as np

from ._lib import INT64_MAX, Image, check, float_arg, fptr, int_arg, lib, path_arg, size_arg

__all__ = ["load_image", "preprocess_image", "save_png", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


ALPHA_WHITE = 1  # VITC_IMAGE_ALPHA_WHITE


def load_image(path, max_pixels=0, alpha_on_white=False):
    """Decode a PNG or JPEG file -> uint8 array [height, width, 3] (RGB).

    Alpha is dropped (PIL's convert("RGB")), or with alpha_on_white
    composited over white (transformers' do_convert_rgb)."""
    img = Image()
    check(lib.vitc_image_load_flags(path_arg(path),
                                    int_arg(max_pixels, "max_pixels", 0, INT64_MAX),
                                    ALPHA_WHITE if alpha_on_white else 0, ctypes.byref(img)))
    try:
        n = img.width * img.height * 3
        arr = np.ctypeslib.as_array(img.rgb, shape=(n,)).copy()
        return arr.reshape(img.height, img.width, 3)
    finally:
        lib.vitc_image_free(ctypes.byref(img))


def _rgb_u8(a, name):
    """An integer array [height, width, 3] of values 0..255 as contiguous uint8.

    A cast alone would wrap 256 to 0 and floor a float image in [0, 1] to black."""
    a = np.asarray(a)
    if a.ndim != 3 or a.shape[2] != 3:
        raise ValueError("%s must be uint8 [height, width, 3], got shape %s" % (name, a.shape))
    if a.dtype != np.uint8:
        if a.dtype.kind not in "iub":
            raise TypeError("%s must hold integers 0..255 (uint8), got %s" % (name, a.dtype))
        if a.size and (a.min() < 0 or a.max() > 255):
            raise ValueError("%s values must be in 0..255, got %d..%d" % (name, a.min(), a.max()))
    return np.ascontiguousarray(a, dtype=np.uint8)


def _as_image(image, alpha_on_white=False):
    arr = (_rgb_u8(image, "image") if isinstance(image, np.ndarray)
           else load_image(image, alpha_on_white=alpha_on_white))
    img = Image(size_arg(arr.shape[1], "image width"), size_arg(arr.shape[0], "image height"),
                arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
    return img, arr


def _per_channel(vals, name, channels):
    """One number per channel as float32, each finite in float32."""
    v = np.asarray(vals, dtype=np.float64).ravel()
    if v.size != channels:
        raise ValueError("%s must have %d values, one per channel, got %d"
                         % (name, channels, v.size))
    return np.array([float_arg(x, name) for x in v], np.float32)


def preprocess_image(image, resize=256, crop=224, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                     channels=3):
    """torchvision's eval transform (Resize(resize) antialiased bilinear,
    CenterCrop(crop), /255, Normalize(mean, std)) -> float32 [channels, crop, crop].

    image: a path, or a uint8 array [height, width, 3]. resize=0: no resize.
    channels=1: luminance first, as torchvision's Grayscale on the uint8
    tensor (mean and std then have one value each).
    """
    if isinstance(channels, bool) or channels not in (1, 3):
        raise ValueError("channels must be 1 or 3, got %r" % (channels,))
    m, s = _per_channel(mean, "mean", channels), _per_channel(std, "std", channels)
    resize, crop = int_arg(resize, "resize", 0), size_arg(crop, "crop")
    img, keep = _as_image(image)
    out = np.empty((channels, crop, crop), dtype=np.float32)
    check(lib.vitc_image_preprocess_channels(ctypes.byref(img), resize, crop, channels,
                                             fptr(m), fptr(s), fptr(out)))
    del keep
    return out


def save_png(path, rgb):
    """Write a uint8 [height, width, 3] array as an RGB PNG."""
    arr = _rgb_u8(rgb, "rgb")
    check(lib.vitc_image_save_png(path_arg(path), arr.ctypes.data, size_arg(arr.shape[1], "width"),
                                  size_arg(arr.shape[0], "height")))
