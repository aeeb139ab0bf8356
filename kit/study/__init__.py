"""``charllm-kit study``: the reference study's findings, measured on this node.

``catalog`` lists the study's findings, ``matrix`` sizes the runs each needs to the node
(one model, one execution mode per finding), ``estimate`` says how long they take (at the pace
the node's earlier studies or its platform file measured), ``run`` runs them through kit.sweep
and the fabric benchmark, ``warmup`` checks that no measured step carried a point's start
(``run`` reruns those that did), ``existing`` concludes from bundles that exist (``study
--from``), ``facts`` reads what a finding needs of a bundle, ``likeness`` says what compared
runs differ in beyond a finding's factor, ``verdicts`` judges each finding (pure functions over
bundles), ``render`` writes the JSON, figures and the report's Findings.
"""
