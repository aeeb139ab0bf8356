"""Read bundles for analysis and export only once they verify.

``compare``, ``report``, ``bundle export-mllog`` and ``bundle system-desc`` turn a bundle's
figures into claims, so an edited ``metrics.json`` must not pass through them without a word.
They read every input through :func:`read_verified_bundle`: a bundle that fails
:func:`kit.bundle.verify.verify_bundle` is refused in one line naming it, unless the user
passes ``--allow-unverified``, in which case it is used and carries the failure in
:attr:`kit.bundle.reader.Bundle.verification_error` for the output to show.

Verification hashes every file, so it reads the whole bundle once: SHA-256 ran at about
1.4 GiB/s on one core of the 2-core CI host, and an hour of 20 ms telemetry from 8 GPUs is at
most a few hundred MB of parquet, well under a second per bundle of that size. The parquet
tables are read again only by the commands that use them.
"""

from dataclasses import replace
from pathlib import Path

from kit.bundle.reader import Bundle, read_bundle
from kit.bundle.verify import verify_bundle
from kit.errors import BundleError

ALLOW_UNVERIFIED_FLAG = "--allow-unverified"


def read_verified_bundle(path: str | Path, allow_unverified: bool = False) -> Bundle:
    """Read a bundle that verifies; refuse one that does not, or mark it when allowed.

    Args:
        path: The bundle directory.
        allow_unverified: Read a bundle that fails verification instead of refusing it; its
            :attr:`~kit.bundle.reader.Bundle.verification_error` says why it failed.

    Raises:
        BundleError: The bundle cannot be read at all (with or without ``allow_unverified``),
            or it fails verification and ``allow_unverified`` is off.
    """
    try:
        verify_bundle(path)
    except BundleError as e:
        bundle = read_bundle(path)  # unreadable: that is the error, whatever the flag says
        if not allow_unverified:
            raise BundleError(
                f"{e}; an unverified bundle is not used ({ALLOW_UNVERIFIED_FLAG} uses it "
                "anyway, marked as unverified)"
            ) from None
        return replace(bundle, verification_error=str(e))
    return read_bundle(path)
