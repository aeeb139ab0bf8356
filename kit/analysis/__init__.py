"""Analysis of result bundles: model FLOPs and MFU, energy, kernel breakdown, compare, report."""
