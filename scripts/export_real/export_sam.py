"""segment-anything's own ONNX wrapper (SamOnnxModel) over a tiny random-weight SAM prompt decoder,
exported as its scripts/export_onnx_model.py does (dynamic number of points; the upscaled masks'
size is the orig_im_size input's value), for tests/zoo/exported/sam-decoder.onnx.

    python scripts/export_real/export_sam.py OUT.onnx
"""
import sys

import torch
import tv_shim  # noqa: F401
from segment_anything.modeling import MaskDecoder, PromptEncoder, Sam, TwoWayTransformer
from segment_anything.utils.onnx import SamOnnxModel
from torch import nn

torch.manual_seed(0)
dim, emb, img = 32, 16, 64


class _Encoder(nn.Module):  # the decoder's export reads only img_size from the image encoder
    img_size = img


sam = Sam(image_encoder=_Encoder(),
          prompt_encoder=PromptEncoder(embed_dim=dim, image_embedding_size=(emb, emb), input_image_size=(img, img),
                                       mask_in_chans=8),
          mask_decoder=MaskDecoder(num_multimask_outputs=3, transformer_dim=dim, iou_head_depth=3,
                                   iou_head_hidden_dim=32,
                                   transformer=TwoWayTransformer(depth=2, embedding_dim=dim, mlp_dim=64, num_heads=2)))
sam.eval()
onnx_model = SamOnnxModel(sam, return_single_mask=True)
feeds = {
    "image_embeddings": torch.randn(1, dim, emb, emb),
    "point_coords": torch.randint(0, img, (1, 5, 2), dtype=torch.float),
    "point_labels": torch.randint(0, 4, (1, 5), dtype=torch.float),
    "mask_input": torch.randn(1, 1, 4 * emb, 4 * emb),
    "has_mask_input": torch.tensor([1], dtype=torch.float),
    "orig_im_size": torch.tensor([48, 80], dtype=torch.float),
}
torch.onnx.export(onnx_model, tuple(feeds.values()), sys.argv[1], input_names=list(feeds),
                  output_names=["masks", "iou_predictions", "low_res_masks"], opset_version=17,
                  dynamic_axes={"point_coords": {1: "num_points"}, "point_labels": {1: "num_points"}},
                  do_constant_folding=True, dynamo=False)
print("exported", sys.argv[1])
