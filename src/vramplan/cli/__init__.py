"""The command line: renders reports, holds no formulas."""
