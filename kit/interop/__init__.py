"""Views of a bundle in other tools' formats, so their tooling can read a kit run.

- :mod:`kit.interop.system_desc`: an MLPerf training system description (``systems/*.json``).
- :mod:`kit.interop.mllog`: MLPerf-style ``:::MLLOG`` lines of the run.
"""
