{{/* Object names: the release name when it says devplug, else RELEASE-devplug. */}}
{{- define "devplug.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "devplug.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "devplug.labels" -}}
{{ include "devplug.selectorLabels" . }}
app.kubernetes.io/part-of: devplug
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The Kubernetes API is used: per-node GPU configs (the Node's label), GPU shares for
the scheduler extender (the Node's inventory, the pods' choices) or DRA. */}}
{{- define "devplug.usesApi" -}}
{{- if or .Values.dra.enabled (and .Values.gpu.enabled (or .Values.gpu.nvidiaConfigs .Values.gpu.shares)) -}}true{{- end -}}
{{- end -}}

{{- define "devplug.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
