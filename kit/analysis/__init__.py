"""What reads finished bundles: compare, ranking, report and its plots.

The figures a run computes as it ends (FLOPs and MFU, energy, power, stragglers, expert load,
kernel breakdowns) are in :mod:`kit.metrics`, below the launcher that needs them.
"""
