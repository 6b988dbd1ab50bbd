"""Ten AdamW steps and ten SGD steps of a small ViT against PyTorch (llm.c's
test_gpt2 in spirit): the same weights, the same batches; vitc runs forward,
vitc.cross_entropy, vitc_vit_backward and its optimizer; torchvision's
VisionTransformer (float64) runs F.cross_entropy, autograd and torch.optim.
Losses within 1e-4 relative at every step, every parameter within 1e-4
(max(1, |ref|)) after the ten steps.

Needs torch and torchvision, and the ViT backward (vitc_vit_backward).
"""
import ctypes
import unittest

import numpy as np

import vitc
from vitc._lib import check, lib

from tests.python.test_train_optim import NO_DECAY, _torch_groups, _Vit

try:
    import torch
    import torch.nn.functional as F
    from torchvision.models.vision_transformer import VisionTransformer as TVViT
except ImportError:  # pragma: no cover
    torch = None

CFG = dict(image_size=16, patch_size=4, in_channels=3, hidden_dim=32, depth=2, num_heads=4,
           mlp_dim=64, num_classes=5)
BATCH, STEPS = 6, 10


def _torch_model(vit):
    m = TVViT(CFG["image_size"], CFG["patch_size"], CFG["depth"], CFG["num_heads"],
              CFG["hidden_dim"], CFG["mlp_dim"], num_classes=CFG["num_classes"]).double()
    sd = {n: torch.tensor(p.astype(np.float64)) for n, p, _ in vit.tensors()}
    m.load_state_dict(sd, strict=True)
    return m.train()


@unittest.skipIf(torch is None, "needs torch and torchvision")
class TestViTTrainingSteps(unittest.TestCase):
    def run_steps(self, make_vitc, make_torch, wd):
        vit = _Vit(seed=11, **CFG)
        lib.vitc_vit_set_training.argtypes, lib.vitc_vit_set_training.restype = [ctypes.c_void_p, ctypes.c_int], None
        lib.vitc_vit_backward.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)]
        lib.vitc_vit_backward.restype = ctypes.c_int
        lib.vitc_vit_forward.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                                         ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                         ctypes.POINTER(ctypes.c_float)]
        lib.vitc_vit_set_training(vit._h, 1)
        tm = _torch_model(vit)
        opt = make_vitc(vit)
        names = [n for n, _, _ in vit.tensors()]
        params = dict(tm.named_parameters())
        topt = make_torch(_torch_groups(names, [params[n] for n in names], False, wd))
        rng = np.random.default_rng(5)
        fp = ctypes.POINTER(ctypes.c_float)
        for step in range(STEPS):
            x = rng.standard_normal((BATCH, 3, CFG["image_size"], CFG["image_size"])).astype(np.float32)
            y = rng.integers(0, CFG["num_classes"], BATCH)
            logits = np.empty((BATCH, CFG["num_classes"]), np.float32)
            check(lib.vitc_vit_forward(vit._h, x.ctypes.data_as(fp), BATCH, CFG["image_size"],
                                       CFG["image_size"], logits.ctypes.data_as(fp)))
            loss, dlogits = vitc.cross_entropy(logits, y, label_smoothing=0.1)
            opt.zero_grad()
            check(lib.vitc_vit_backward(vit._h, dlogits.ctypes.data_as(fp)))
            opt.step()

            topt.zero_grad()
            tloss = F.cross_entropy(tm(torch.tensor(x, dtype=torch.float64)), torch.tensor(y),
                                    label_smoothing=0.1)
            tloss.backward()
            topt.step()
            self.assertLessEqual(abs(loss - tloss.item()), 1e-4 * abs(tloss.item()),
                                 "step %d: loss %.8g vs torch %.8g" % (step, loss, tloss.item()))
        worst = (0.0, "")
        for n, p, _ in vit.tensors():
            ref = params[n].detach().numpy()
            err = float(np.abs(p - ref).max()) / max(1.0, float(np.abs(ref).max()))
            worst = max(worst, (err, n))
        self.assertLessEqual(worst[0], 1e-4, "parameter %s after %d steps" % (worst[1], STEPS))
        del opt
        vit.free()

    def test_adamw_ten_steps(self):
        # lr 1e-4: AdamW moves an element whose true gradient is 0 (the key
        # bias: softmax ignores it) by up to lr per step in whatever direction
        # float32 rounding gives its ~1e-9 gradient, where float64's ~1e-18
        # stays under eps; at lr 1e-3 that alone reaches 9e-5 after ten steps.
        # wd 0.5 keeps a wrong decay group visible (5e-4 * |p| over ten steps).
        self.run_steps(lambda m: vitc.AdamW(m, lr=1e-4, weight_decay=0.5),
                       lambda g: torch.optim.AdamW(g, lr=1e-4), 0.5)

    def test_sgd_ten_steps(self):
        self.run_steps(lambda m: vitc.SGD(m, lr=0.05, momentum=0.9, nesterov=True,
                                          weight_decay=1e-4),
                       lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.9, nesterov=True), 1e-4)


if __name__ == "__main__":
    unittest.main()
