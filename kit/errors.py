"""The kit's own exception hierarchy.

Callers catch these, never a vendor's exceptions. The CLI turns a :class:`KitInputError`
into one line on stderr and exit code 2.
"""


class KitError(Exception):
    """Base class of every error the kit raises on purpose."""


class KitInputError(KitError):
    """Bad input from the user: unknown name, invalid YAML, impossible layout, absent platform.

    The message must be one line that says what is wrong and how to fix it.
    """


class BundleError(KitInputError):
    """A result bundle that is missing, corrupt, tampered with or of an unknown schema."""



class RunNotPublished(KitError):
    """A run whose bundle could not be written (a full disk): its staging folder keeps what
    was recorded, and ``bundle recover`` publishes it once the cause is fixed. Exit code 1."""
