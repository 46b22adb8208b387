"""Reduced-precision variants of ONNX models: FP16 conversion, INT8 static quantization with calibration,
the quality of each against FP32, and the sidecar record that says what a variant was made from."""
