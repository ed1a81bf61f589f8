"""quantize stage."""
