"""ultralytics' own ONNX export of a YOLOv8 detector with NMS inside (dynamic batch and image size),
random weights, for tests/zoo/exported/yolov8-nms.onnx.

The model is YOLOv8's architecture file at width 1/16 (as small as a committed test file should be,
every block type of yolov8n kept) with 6 classes. Random weights alone make a degenerate detector:
the features fade layer by layer and every image gets the same boxes with tied scores (an NMS test
of nothing but its tie-breaking). So the batch norms take the statistics of one pass over random
images (every layer's activations then carry the input), and the class head's biases are raised
(ultralytics initialises them so that every score starts near 0: no detection).

    python scripts/export_real/export_yolo.py tests/zoo/exported/yolov8-nms.onnx
(in an environment from scripts/export_real/requirements.txt; see tv_shim.py)
"""
import os
import shutil
import sys
import tempfile

os.environ["YOLO_OFFLINE"] = "1"
import torch  # noqa: E402
import tv_shim  # noqa: E402,F401
import ultralytics  # noqa: E402
import yaml  # noqa: E402
from ultralytics import YOLO  # noqa: E402

out = sys.argv[1]
cfg = yaml.safe_load(open(os.path.join(os.path.dirname(ultralytics.__file__), "cfg/models/v8/yolov8.yaml")))
cfg.pop("scales")
cfg.update(nc=6, depth_multiple=0.33, width_multiple=0.0625)
with tempfile.TemporaryDirectory() as tmp:
    spec = os.path.join(tmp, "yolov8-tiny.yaml")
    yaml.safe_dump(cfg, open(spec, "w"))
    torch.manual_seed(0)
    model = YOLO(spec)
    net = model.model
    with torch.no_grad():
        for seq in net.model[-1].cv3:
            seq[-1].bias.normal_(-1.0, 1.5)
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.momentum = 1.0  # the next pass's batch statistics become the running ones
        net.train()
        net(torch.rand(8, 3, 320, 320))
        net.eval()
    path = model.export(format="onnx", dynamic=True, nms=True, imgsz=320, simplify=False, opset=17)
    shutil.move(path, out)
print("exported", out)
