"""torchvision's ViT-B/16 with random weights (seed 0) to ONNX, batch dynamic,
and the same model to safetensors for vitc: the two runtimes time one model."""
import subprocess
import sys

import torch
import torchvision

out_onnx, out_st = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
m = torchvision.models.vit_b_16().eval()
torch.onnx.export(m, torch.randn(1, 3, 224, 224), out_onnx, input_names=["x"], output_names=["y"],
                  dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, opset_version=14)
pth = out_st + ".pth"
torch.save(m.state_dict(), pth)
root = __file__.rsplit("/bench/", 1)[0]
subprocess.run([sys.executable, root + "/tools/export_safetensors.py", pth, out_st, "--arch", "vit_b_16"],
               check=True)
