"""``charllm-kit study``: the reference study's findings, measured on this node.

``catalog`` lists the study's findings, ``matrix`` sizes the runs each needs to the node,
``estimate`` says how long they take, ``run`` runs them through kit.sweep and the fabric
benchmark, ``existing`` concludes from bundles that exist (``study --from``), ``facts`` reads
what a finding needs of a bundle, ``likeness`` says what compared runs differ in beyond a
finding's factor, ``verdicts`` judges each finding (pure functions over bundles), ``render``
writes the JSON, figures and the report's Findings.
"""
