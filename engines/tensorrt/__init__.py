"""TensorRT engines: build from ONNX, calibrate for INT8, and the manifest that ties an engine to its GPU.

Importing this package never imports `tensorrt` or CUDA; those load when a build or a run starts.
"""
