"""Sweeps: a base run plus axes and constraints in one YAML file, one bundle per valid point.

``spec`` declares the file, ``conditions`` evaluates its constraints safely, ``expand`` turns it
into points, ``plan`` says which points are valid here and why the others are skipped,
``runner`` runs the valid ones and keeps the sweep index, ``tables`` prints both.
"""
