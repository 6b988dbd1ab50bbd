"""Reference tensors for tests/test_sam_decoder.c, written by PyTorch.

    .venv/bin/python tests/reference/gen_sam_decoder.py    (writes tests/reference/sam_decoder/)

transformers' SamModel with a small random-weight config (hidden size 32, a
16 x 16 image embedding, input side 256) run with image_embeddings given,
its prompts mapped in and masks out by SamProcessor as a user would:

  model.safetensors   the prompt encoder's, mask decoder's and shared
                      positional embedding's tensors (as save_pretrained
                      names them; the tied copy left out)
  config.json         the SamConfig
  image.safetensors   "emb" [32, 16, 16], the image embedding
  CASE.safetensors    the prompt ("points" [n, 2], "labels" [n], "box" [4],
                      "mask" [64, 64]: those given), "meta" [orig_h, orig_w,
                      resized_h, resized_w, multimask], and SamModel's
                      "low" [n_masks, 64, 64] and "iou" [n_masks]; two cases
                      also "masks" [n_masks, orig_h, orig_w] from
                      post_process_masks(binarize=False).
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import SamConfig, SamModel, SamProcessor
from transformers.models.sam.image_processing_sam import SamImageProcessor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_write  # noqa: E402

OUT = os.path.join(HERE, "sam_decoder")
S = 256  # the input side (prompt encoder's image_size)


def small_config():
    return SamConfig(
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           output_channels=32, image_size=S, patch_size=16, mlp_dim=64,
                           global_attn_indexes=[0], num_pos_feats=16, window_size=4),
        prompt_encoder_config=dict(hidden_size=32, image_size=S, patch_size=16,
                                   mask_input_channels=8),
        mask_decoder_config=dict(hidden_size=32, mlp_dim=64, num_attention_heads=2,
                                 iou_head_hidden_dim=24),
    )


def randomize(model):
    """Trained-like values: the default init zeroes biases and keeps the
    LayerNorms at identity, which would hide transposed or missing terms."""
    g = torch.Generator().manual_seed(7)
    embeddings = {n + ".weight" for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Embedding)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("vision_encoder") or "positional_embedding" in name:
                continue
            r = torch.randn(p.shape, generator=g)
            if name in embeddings:
                p.copy_(r)
            elif "layer_norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * r)
            elif p.dim() == 1:
                p.copy_(0.2 * r)
            else:  # a Linear's or convolution's weight
                p.copy_(r / np.sqrt(p[0].numel()))


def processor():
    ip = SamImageProcessor(size={"longest_edge": S}, pad_size={"height": S, "width": S})
    return SamProcessor(image_processor=ip)


def run_case(model, proc, emb, orig, points=None, labels=None, box=None, mask=None,
             multimask=True, post=False):
    oh, ow = orig
    rh, rw = proc.image_processor._get_preprocess_shape((oh, ow), S)
    kw = {}
    t = {"meta": np.array([oh, ow, rh, rw, int(multimask)], np.float32)}
    if points is not None:
        pts = proc._normalize_coordinates(S, np.array(points, np.float64), (oh, ow))
        kw["input_points"] = torch.from_numpy(pts)[None, None]  # float64, as the processor's
        lab = np.array(labels if labels is not None else [1] * len(points), np.int64)
        kw["input_labels"] = torch.from_numpy(lab)[None, None]
        t["points"] = np.array(points, np.float32)
        t["labels"] = lab.astype(np.float32)
    if box is not None:
        b = proc._normalize_coordinates(S, np.array([box], np.float64), (oh, ow),
                                        is_bounding_box=True)
        kw["input_boxes"] = torch.from_numpy(b)[None]
        t["box"] = np.array(box, np.float32)
    if mask is not None:
        kw["input_masks"] = torch.from_numpy(mask)[None, None]
        t["mask"] = mask
    with torch.no_grad():
        o = model(image_embeddings=emb, multimask_output=multimask, **kw)
    t["low"] = o.pred_masks[0, 0].numpy().astype(np.float32)
    t["iou"] = o.iou_scores[0, 0].numpy().astype(np.float32)
    if post:
        m = proc.post_process_masks(o.pred_masks, [(oh, ow)], [(rh, rw)], binarize=False)
        t["masks"] = m[0][0].numpy().astype(np.float32)
    return t


def main():
    torch.manual_seed(0)
    cfg = small_config()
    model = SamModel(cfg).eval()
    randomize(model)
    proc = processor()
    os.makedirs(OUT, exist_ok=True)
    sd = {k: v for k, v in model.state_dict().items()
          if k.startswith(("prompt_encoder.", "mask_decoder.", "shared_image_embedding."))
          and k != "prompt_encoder.shared_embedding.positional_embedding"}
    st_write.write(os.path.join(OUT, "model.safetensors"), sd)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(cfg.to_dict(), f, indent=1, default=str)
    emb = torch.randn(1, 32, 16, 16)
    st_write.write(os.path.join(OUT, "image.safetensors"), {"emb": emb[0]})
    rng = np.random.default_rng(3)
    mask = (rng.standard_normal((64, 64)) * 4).astype(np.float32)
    cases = {
        # a wide photo: one foreground point, the three masks, post-processed
        "point": dict(orig=(150, 220), points=[[60.5, 40.0]], multimask=True, post=True),
        "points_bg": dict(orig=(150, 220), points=[[10, 20], [200, 140], [110.25, 75]],
                          labels=[1, 0, 1], multimask=False),
        "box": dict(orig=(150, 220), box=[20, 30, 180, 120], multimask=True),
        # a tall photo: a box and two points, the single mask, post-processed
        "box_points": dict(orig=(200, 130), points=[[40, 50], [100, 180]], labels=[1, 0],
                           box=[5, 10, 125, 190], multimask=False, post=True),
        "mask": dict(orig=(150, 220), points=[[100, 60]], mask=mask, multimask=True),
        "mask_only": dict(orig=(256, 256), mask=mask, multimask=False),
    }
    for name, c in cases.items():
        st_write.write(os.path.join(OUT, name + ".safetensors"), run_case(model, proc, emb, **c))
        print("wrote", name)


if __name__ == "__main__":
    main()
