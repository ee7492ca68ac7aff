{{/* Rules on cluster-scoped resources, needed whatever the namespace scoping. */}}
{{- define "clef-serving.clusterRules" -}}
# Eligibility: GPU nodes, grouped by pool, with their GPU Feature Discovery labels.
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
# kopf: notice CRDs (ours, KServe's) that appear or go while the operator runs; the operator: confirm that no
# InferenceService CRD exists before it chooses the deployment backend.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.operator.watchNamespaces }}
# kopf: notice the watched namespaces appear or go.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- else if .Values.peering.enabled }}
# kopf: keep-alives in the cluster-wide peering object.
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [list, watch, patch]
{{- end }}
{{- end }}

{{/* Rules on namespaced resources: in a ClusterRole when cluster-wide, else in a Role per namespace. */}}
{{- define "clef-serving.namespacedRules" -}}
# The ClefDecisions it reconciles: kopf's progress annotations, and the status.
- apiGroups: [clef-serving.io]
  resources: [clefdecisions]
  verbs: [list, watch, patch]
- apiGroups: [clef-serving.io]
  resources: [clefdecisions/status]
  verbs: [patch]
# The InferenceServices' ownerReferences block their owner's deletion: where the API server enforces
# owner-reference permissions (OwnerReferencesPermissionEnforcement), that needs this.
- apiGroups: [clef-serving.io]
  resources: [clefdecisions/finalizers]
  verbs: [update]
# One InferenceService per eligible node pool (the kserve backend); `get` reads the owner of one holding a
# wanted name.
- apiGroups: [serving.kserve.io]
  resources: [inferenceservices]
  verbs: [get, list, watch, create, patch, delete]
# The deployment backend: a Deployment per eligible pool (watched for readiness; `get` as above), its Service,
# and its HorizontalPodAutoscaler when autoscaled, or its KEDA ScaledObject with autoscaling.keda (`get` reads
# the holder of a name whose create was refused: its own, with a hand-edited decision label, is repaired).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, create, patch, delete]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, create, patch, delete]
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, list, create, patch, delete]
# Kubernetes Events for each decision.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if and .Values.peering.enabled .Values.operator.watchNamespaces }}
# kopf: keep-alives in the peering object of each watched namespace.
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [list, watch, patch]
{{- end }}
{{- end }}
