"""Kiln's accelerator targets. vta/: a simulated VTA-compatible FPGA accelerator."""
