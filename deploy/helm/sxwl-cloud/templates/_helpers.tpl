{{- define "sxwl-cloud.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sxwl-cloud.fullname" -}}
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

{{- define "sxwl-cloud.labels" -}}
app.kubernetes.io/name: {{ include "sxwl-cloud.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "sxwl-cloud.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sxwl-cloud.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Secret that holds SXWL_DATABASE_URL and SXWL_SECRET_KEY. */}}
{{- define "sxwl-cloud.secret" -}}
{{- .Values.existingSecret | default (include "sxwl-cloud.fullname" .) -}}
{{- end -}}

{{/* The Secret whose keys are the object store's settings, or nothing when artifacts stay local. */}}
{{- define "sxwl-cloud.s3Secret" -}}
{{- if .Values.s3.existingSecret -}}
{{- .Values.s3.existingSecret -}}
{{- else if .Values.s3.env -}}
{{- printf "%s-s3" (include "sxwl-cloud.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "sxwl-cloud.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
