"""calibration_data stage."""
