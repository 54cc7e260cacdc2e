{{/* Full name of the release's objects. */}}
{{- define "quiver.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "quiver.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: quiver-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Pod selector. */}}
{{- define "quiver.selector" -}}
app.kubernetes.io/name: quiver-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "quiver.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "quiver.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "quiver.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicaCount) 1) -}}true{{- end -}}
{{- end -}}

{{/* An image reference: (list $ .Values.image) -> [imageRegistry/]repository:tag (tag: appVersion). */}}
{{- define "quiver.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- with $root.Values.imageRegistry }}{{ trimSuffix "/" . }}/{{ end -}}
{{- $image.repository }}:{{ $image.tag | default $root.Chart.AppVersion }}
{{- end -}}
