"""INT8 post-training quantization: calibration, the QuantizeGraph rewrite, the accuracy check."""
