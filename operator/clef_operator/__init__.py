"""clef_operator: a kopf operator that serves Clef-flash on every eligible GPU node pool.

A ``ClefDecision`` (group ``clef-serving.io``, version ``v1alpha1``) is reconciled into one KServe
``InferenceService`` per GPU node pool whose GPUs can run the model (compute capability 8.9+ for FP8), or, with
the deployment backend (clusters without KServe), one ``Deployment`` with its ``Service``.
Run it with ``python -m clef_operator``.
"""

from clef_operator.constants import GROUP, KIND, PLURAL, VERSION

__all__ = ["GROUP", "KIND", "PLURAL", "VERSION"]
