"""chattts_forge/torch_ref stage."""
