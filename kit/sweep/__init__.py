"""Sweeps: a base run plus axes and constraints in one YAML file, one bundle per valid point.

``spec`` declares the file and expands it into points, ``conditions`` evaluates constraints
safely, ``plan`` says which points are valid here and why the others are skipped, ``runner``
runs the valid ones, ``index`` keeps ``sweep.json``, ``tables`` prints the plan and the summary.
"""
