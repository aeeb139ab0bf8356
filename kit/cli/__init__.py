"""The ``charllm-kit`` command line: thin click commands over the kit's importable functions.

``commands`` holds the command group and its commands (``main`` is the console entry point),
``group`` the group's ordering and help, ``options`` the options generated from request
models, ``tables`` the summary tables commands print, ``cache`` the ``cache`` commands.
"""
