"""Inference shared by validation during training and the evaluate command: padding, precision and runtime, batched prediction, the ONNX export."""
