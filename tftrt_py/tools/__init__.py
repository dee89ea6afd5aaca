"""Command-line tools: tftrt-convert, tftrt-exec, tftrt-inspect, tftrt-export (and their helpers).

The plan-only paths (running or inspecting a .plan file) import no TensorFlow.
"""
