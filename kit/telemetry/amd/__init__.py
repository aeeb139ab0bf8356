"""AMD telemetry: the AMD SMI source (:mod:`.amdsmi`) and what AMD SMI's releases and ASICs do
differently (:mod:`.quirks`: field names per release, die pairing, units, throttle bits)."""
