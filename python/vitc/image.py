"""Images: decoding (PNG, JPEG) and torchvision-style preprocessing, in C."""
import ctypes

import numpy as np

from ._lib import check, fptr, lib

__all__ = ["load_image", "preprocess_image", "save_png", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class _Image(ctypes.Structure):
    _fields_ = [("width", ctypes.c_int), ("height", ctypes.c_int),
                ("rgb", ctypes.POINTER(ctypes.c_uint8))]


lib.vitc_image_load.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(_Image)]
lib.vitc_image_free.argtypes = [ctypes.POINTER(_Image)]
lib.vitc_image_free.restype = None
lib.vitc_image_save_png.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
lib.vitc_image_preprocess.argtypes = [ctypes.POINTER(_Image), ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_float),
                                      ctypes.POINTER(ctypes.c_float),
                                      ctypes.POINTER(ctypes.c_float)]
lib.vitc_image_preprocess_channels.argtypes = [ctypes.POINTER(_Image), ctypes.c_int, ctypes.c_int,
                                               ctypes.c_int, ctypes.POINTER(ctypes.c_float),
                                               ctypes.POINTER(ctypes.c_float),
                                               ctypes.POINTER(ctypes.c_float)]


def _path(p):
    return p if isinstance(p, bytes) else str(p).encode()


def load_image(path, max_pixels=0):
    """Decode a PNG or JPEG file -> uint8 array [height, width, 3] (RGB)."""
    img = _Image()
    check(lib.vitc_image_load(_path(path), int(max_pixels), ctypes.byref(img)))
    try:
        n = img.width * img.height * 3
        arr = np.ctypeslib.as_array(img.rgb, shape=(n,)).copy()
        return arr.reshape(img.height, img.width, 3)
    finally:
        lib.vitc_image_free(ctypes.byref(img))


def _as_image(image):
    if isinstance(image, np.ndarray):
        arr = np.ascontiguousarray(image, dtype=np.uint8)
        if arr.ndim != 3 or arr.shape[2] != 3:
            raise ValueError("image must be uint8 [height, width, 3], got shape %s" % (arr.shape,))
    else:
        arr = load_image(image)
    img = _Image(arr.shape[1], arr.shape[0],
                 arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
    return img, arr


def preprocess_image(image, resize=256, crop=224, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                     channels=3):
    """torchvision's eval transform (Resize(resize) antialiased bilinear,
    CenterCrop(crop), /255, Normalize(mean, std)) -> float32 [channels, crop, crop].

    image: a path, or a uint8 array [height, width, 3]. resize=0: no resize.
    channels=1: luminance first, as torchvision's Grayscale on the uint8
    tensor (mean and std then have one value each).
    """
    img, keep = _as_image(image)
    if int(channels) not in (1, 3):
        raise ValueError("channels must be 1 or 3, got %r" % (channels,))
    m = np.asarray(mean, dtype=np.float32).reshape(int(channels))
    s = np.asarray(std, dtype=np.float32).reshape(int(channels))
    if int(crop) <= 0:
        raise ValueError("crop must be positive")
    out = np.empty((int(channels), int(crop), int(crop)), dtype=np.float32)
    check(lib.vitc_image_preprocess_channels(ctypes.byref(img), int(resize), int(crop),
                                             int(channels), fptr(m), fptr(s), fptr(out)))
    del keep
    return out


def save_png(path, rgb):
    """Write a uint8 [height, width, 3] array as an RGB PNG."""
    arr = np.ascontiguousarray(rgb, dtype=np.uint8)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError("rgb must be uint8 [height, width, 3], got shape %s" % (arr.shape,))
    check(lib.vitc_image_save_png(_path(path), arr.ctypes.data, arr.shape[1], arr.shape[0]))
