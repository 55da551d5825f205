{{/* The release's full name, at most 63 characters (a DNS label). */}}
{{- define "infernetes.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "infernetes.operatorName" -}}
{{- printf "%s-operator" (include "infernetes.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "infernetes.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "infernetes.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Selector labels: immutable once the Deployment exists. */}}
{{- define "infernetes.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "infernetes.labels" -}}
{{ include "infernetes.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* registry/repository:tag or @digest; the tag defaults to the chart's appVersion. */}}
{{- define "infernetes.imageRef" -}}
{{- $image := index . 0 -}}
{{- $appVersion := index . 1 -}}
{{- $name := printf "%s/%s" $image.registry $image.repository | trimPrefix "/" -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $name $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (default $appVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "infernetes.peeringName" -}}
{{- default (include "infernetes.fullname" .) .Values.peering.name -}}
{{- end -}}

{{/* The peering is per namespace when the operator watches a list of them (kopf's rule). */}}
{{- define "infernetes.peeringEnabled" -}}
{{- if or .Values.peering.enabled (gt (int .Values.replicaCount) 1) -}}true{{- end -}}
{{- end -}}
