"""Names shared by the CRD, the builders and the handlers: API coordinates, labels, annotations."""

from __future__ import annotations

# The ClefDecision custom resource.
GROUP = "clef-serving.io"
VERSION = "v1alpha1"
PLURAL = "clefdecisions"
KIND = "ClefDecision"
API_VERSION = f"{GROUP}/{VERSION}"

# KServe's InferenceService.
KSERVE_GROUP = "serving.kserve.io"
KSERVE_VERSION = "v1beta1"
KSERVE_PLURAL = "inferenceservices"
KSERVE_API_VERSION = f"{KSERVE_GROUP}/{KSERVE_VERSION}"
KSERVE_DEPLOYMENT_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
KSERVE_AUTOSCALER_ANNOTATION = "serving.kserve.io/autoscalerClass"

# The backends that serve a ClefDecision's pools (spec.backend): KServe InferenceServices, or plain Deployments.
KSERVE_BACKEND = "kserve"
DEPLOYMENT_BACKEND = "deployment"
BACKENDS: tuple[str, ...] = (KSERVE_BACKEND, DEPLOYMENT_BACKEND)
AUTO_BACKEND = "auto"  # --default-backend: kserve where the InferenceService resource is served, else deployment

# Seconds an operator replica's kopf peering keep-alive counts as live (settings.peering.lifetime; kopf's default
# is 60). kopf rewrites it 5 to 10 s before it expires; a replica killed without exiting keeps the others, and its
# own restarted pod, paused until it expires. See docs/operator.md, "Several replicas".
PEERING_LIFETIME = 20

# Labels and annotations the operator puts on the objects it owns.
DECISION_LABEL = f"{GROUP}/decision"
POOL_LABEL = f"{GROUP}/pool"
PREDICTOR_LABEL = f"{GROUP}/predictor"  # the deployment backend's pods: the name of their Deployment
POOL_ANNOTATION = f"{GROUP}/pool"
POOL_LABEL_KEY_ANNOTATION = f"{GROUP}/pool-label-key"
VARIANT_ANNOTATION = f"{GROUP}/variant"
MANAGED_BY = "clef-operator"

# Well-known node labels naming a node's pool, tried in this order when spec.nodePools.labelKey is unset.
POOL_LABEL_KEYS: tuple[str, ...] = (
    "cloud.google.com/gke-nodepool",  # GKE
    "eks.amazonaws.com/nodegroup",  # EKS managed node groups
    "kubernetes.azure.com/agentpool",  # AKS
    "karpenter.sh/nodepool",  # Karpenter
)

# NVIDIA GPU Feature Discovery labels and the device plugin's resource name.
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_FAMILY_LABEL = "nvidia.com/gpu.family"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_COMPUTE_MAJOR_LABEL = "nvidia.com/gpu.compute.major"
GPU_COMPUTE_MINOR_LABEL = "nvidia.com/gpu.compute.minor"
