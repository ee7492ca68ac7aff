{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "clef-serving.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, prefixed to the chart name unless it already contains it. */}}
{{- define "clef-serving.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart-version, as the helm.sh/chart label wants it. */}}
{{- define "clef-serving.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator's pods; they never change across upgrades. */}}
{{- define "clef-serving.selectorLabels" -}}
app.kubernetes.io/name: {{ include "clef-serving.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Standard labels on every object of the release. */}}
{{- define "clef-serving.labels" -}}
helm.sh/chart: {{ include "clef-serving.chart" . }}
app.kubernetes.io/name: {{ include "clef-serving.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: clef-serving
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "clef-serving.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "clef-serving.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference from {repository, tag}; the tag defaults to the chart's appVersion. */}}
{{- define "clef-serving.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* The predictor serving runtime's name. */}}
{{- define "clef-serving.servingRuntimeName" -}}
{{- default (printf "%s-predictor" (include "clef-serving.fullname" .)) .Values.servingRuntime.name | trunc 63 | trimSuffix "-" }}
{{- end }}
