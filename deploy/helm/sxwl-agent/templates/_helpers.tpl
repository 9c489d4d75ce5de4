{{- define "sxwl-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sxwl-agent.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sxwl-agent.labels" -}}
app.kubernetes.io/name: {{ include "sxwl-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "sxwl-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sxwl-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Whether the agent serves the input cache: only a CPod that takes fine-tunes, endpoint replicas
or dev environments has inputs to serve. */}}
{{- define "sxwl-agent.servesInputs" -}}
{{- if and .Values.inputCache.enabled (or .Values.jobs.trainerImage .Values.jobs.engineImage .Values.devEnvs.enabled) -}}true{{- end -}}
{{- end -}}

{{/* The Secret that holds SXWL_ACCESS_KEY (and SXWL_API_URL when cloud.url is empty). */}}
{{- define "sxwl-agent.accessKeySecret" -}}
{{- if .Values.existingSecret -}}
{{- .Values.existingSecret -}}
{{- else -}}
{{- printf "%s-access-key" (include "sxwl-agent.fullname" .) -}}
{{- end -}}
{{- end -}}
